"""The parallel plan: one run on several workers, each expert's token sequence split across them (Ulysses
sequence parallelism around self-attention). Pure: which devices, how the sequence divides, what the report
says; the workers themselves are glue (nodes/parallel/)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import Wan22InputError

MAX_WORKERS = 64
AUTO = "auto"
DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
INSTALL = "pip install 'ray>=2.60' yunchang (into ComfyUI's Python), then restart ComfyUI"


# How a stage's work is shared: "ulysses" splits each sequence over every worker; "cfg" gives the positive and
# the negative prompt of each evaluation to different workers (two workers: one prompt each), at a stage whose
# CFG is above 1 (at CFG 1 there is one prompt: the stage splits its sequence); "auto" picks per stage.
SPLITS = ("auto", "ulysses", "cfg")
SAVED_SPLIT = "ulysses"  # what workflows saved before the split input run with
CFG_WORKERS = 2  # the CFG split shares the two prompts of an evaluation between two workers


@dataclass(frozen=True)
class ParallelPlan:
    """`devices`: one per worker, "cpu", "cuda:N" (that GPU) or "cuda" (a GPU the Ray cluster picks)."""

    workers: int
    devices: tuple[str, ...]
    ulysses_degree: int
    cpu_threads: int  # torch threads per CPU worker
    split: str = SAVED_SPLIT

    @property
    def backend(self) -> str:
        return "gloo" if self.devices[0] == "cpu" else "nccl"

    def summary(self) -> dict:
        return {"workers": self.workers, "devices": list(self.devices), "ulysses_degree": self.ulysses_degree,
                "split": self.split, "backend": self.backend,
                "cpu_threads": self.cpu_threads if self.backend == "gloo" else None}

    def stage_split(self, cfg: float) -> str:
        """What a stage at this CFG uses: "cfg" (its two prompts on the two workers) or "ulysses"."""
        return "cfg" if self.split in ("auto", "cfg") and float(cfg) > 1.0 and self.workers == CFG_WORKERS \
            else "ulysses"


def head_divisors(heads: int) -> list[int]:
    return [d for d in range(2, heads + 1) if heads % d == 0]


def parse_devices(devices: str, workers: int, *, gpus: int, cpus: int, cluster: bool = False) -> tuple[str, ...]:
    """One device per worker from the node's `devices` text: "auto" (this machine's GPUs, else its CPU), or a
    comma-separated list. `gpus`/`cpus`: what this process sees, for "auto" and for the bounds; `cluster`: the
    workers join a Ray cluster (RAY_ADDRESS), whose machines hold the GPUs a bare "cuda" asks for."""
    text = (devices or AUTO).strip().lower()
    if text == AUTO:
        if gpus:
            if workers > gpus:
                raise Wan22InputError("workers", f"{workers} workers but this machine has {gpus} GPU(s) (devices "
                                                 f"'auto'): use at most {gpus} workers, or list the devices")
            return tuple(f"cuda:{i}" for i in range(workers))
        if workers > cpus:
            raise Wan22InputError("workers", f"{workers} CPU workers but this machine has {cpus} CPU cores: use at "
                                             f"most {cpus} workers")
        return ("cpu",) * workers
    entries = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in entries if not DEVICE.match(e)]
    if bad or not entries:
        raise Wan22InputError("devices", f"{devices!r} is not a device list: write 'auto', or devices separated by "
                                         "commas, e.g. 'cuda:0, cuda:1' (or 'cuda, cuda' for GPUs the Ray cluster "
                                         "picks, or 'cpu, cpu')")
    if len({e.split(":")[0] for e in entries}) > 1:
        raise Wan22InputError("devices", f"{devices!r} mixes CPU and GPU workers: one run's workers share one "
                                         "communication backend (gloo on CPU, NCCL on GPUs); list one kind")
    entries = ["cpu" if e.startswith("cpu") else e for e in entries]
    pinned = [e for e in entries if e.startswith("cuda:")]
    if pinned and "cuda" in entries:
        raise Wan22InputError("devices", f"{devices!r} mixes pinned GPUs (cuda:N) with GPUs the Ray cluster picks "
                                         "(cuda), which could put two workers on one GPU: list one kind")
    if len(set(pinned)) != len(pinned):
        raise Wan22InputError("devices", f"{devices!r} names a GPU twice: each worker needs a GPU of its own")
    if workers > len(entries):
        raise Wan22InputError("workers", f"more workers ({workers}) than devices ({len(entries)}: "
                                         f"{', '.join(entries)}): list a device for each worker, or use fewer")
    entries = entries[:workers]
    if entries[0] == "cpu" and workers > cpus:
        raise Wan22InputError("workers", f"{workers} CPU workers but this machine has {cpus} CPU cores: use at "
                                         f"most {cpus} workers")
    missing = [e for e in entries if e.startswith("cuda:") and int(e.split(":")[1]) >= gpus]
    if missing:
        raise Wan22InputError("devices", f"{devices!r} names {', '.join(missing)}, but this process sees {gpus} "
                                         f"GPU(s){f' (cuda:0 to cuda:{gpus - 1})' if gpus else ''}: list GPUs it "
                                         "sees, or 'cpu, cpu'")
    if entries.count("cuda") > gpus and not cluster:
        raise Wan22InputError("devices", f"{devices!r} asks for {entries.count('cuda')} GPUs, but this process sees "
                                         f"{gpus}: list at most {gpus} (with RAY_ADDRESS set, the Ray cluster's "
                                         "machines provide them)")
    return tuple(entries)


def make_plan(*, workers: int, devices: str, ulysses_degree: int, heads: int, cpu_threads: int, gpus: int,
              cpus: int, cluster: bool = False, split: str = SAVED_SPLIT) -> ParallelPlan:
    """The plan, every value checked and refused by its input name before any worker starts: no more CPU
    workers or threads than the cores, no GPU this process does not see (see parse_devices)."""
    workers, degree = int(workers), int(ulysses_degree)
    if split not in SPLITS:
        raise Wan22InputError("split", f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if split == "cfg" and int(workers) != CFG_WORKERS:
        raise Wan22InputError("split", f"the CFG split shares the two prompts of each evaluation between "
                                       f"{CFG_WORKERS} workers, not {workers}: use {CFG_WORKERS} workers, or the "
                                       "'ulysses' or 'auto' split")
    if not 2 <= workers <= MAX_WORKERS:
        raise Wan22InputError("workers", f"{workers} workers: use between 2 and {MAX_WORKERS} (one run on one "
                                         "device needs no plan)")
    devices = parse_devices(devices, workers, gpus=gpus, cpus=cpus, cluster=cluster)
    divisors = head_divisors(heads)
    if degree < 2:
        raise Wan22InputError("ulysses_degree", f"{degree} splits nothing: the degree is how many workers share "
                                                f"each sequence; use one that divides the {heads} attention heads "
                                                f"({', '.join(map(str, divisors)) or 'none'})")
    if heads % degree:
        raise Wan22InputError("ulysses_degree", f"{degree} does not divide the experts' {heads} attention heads "
                                                "(each worker attends with an equal share of them): use "
                                                f"{', '.join(map(str, divisors)) or 'experts with more heads'}")
    if degree != workers:
        raise Wan22InputError("ulysses_degree", f"{degree} with {workers} workers: every worker takes part in "
                                                "each sequence's split, so the degree must equal the number of "
                                                f"workers; set both to {degree} or both to {workers}")
    if not 0 <= int(cpu_threads) <= cpus:
        raise Wan22InputError("cpu_threads", f"{cpu_threads} threads: use 0 (share the cores) up to this "
                                             f"machine's {cpus} cores")
    threads = int(cpu_threads) or max(1, cpus // workers)
    return ParallelPlan(workers=workers, devices=devices, ulysses_degree=degree, cpu_threads=threads, split=split)


def latent_tokens(shape, patch=(1, 2, 2)) -> int:
    """The transformer tokens of a video latent [B, C, T, H, W], as Wan's patch embedding makes them (the
    latent padded up to whole patches)."""
    t, h, w = (int(s) for s in shape[-3:])
    return -(-t // patch[0]) * -(-h // patch[1]) * -(-w // patch[2])


def check_sequence(tokens: int, degree: int) -> None:
    """The sequence must split into equal shards: every worker's self-attention then gets the same share, and
    cache-dit's averages of the residual statistic over the workers equal the whole sequence's."""
    if tokens % degree:
        raise Wan22InputError("ulysses_degree", f"the video's {tokens} tokens (latent frames x height/16 x "
                                                f"width/16) do not split into {degree} equal parts: pick a size "
                                                f"whose token count divides by {degree} (e.g. a width that is a "
                                                f"multiple of {16 * degree}), or another degree")


def shard(tokens: int, degree: int, rank: int) -> slice:
    size = tokens // degree
    return slice(rank * size, (rank + 1) * size)


def parallel_report(plan: ParallelPlan, ranks: list[dict]) -> dict:
    """The report's `parallel` entry from each rank's own figures (seconds, seconds communicating, what
    its cache decided), in rank order."""
    return {
        **plan.summary(),
        "rank_seconds": [round(r["seconds"], 4) for r in ranks],
        "communication_share": [round(r["comm_seconds"] / r["seconds"], 4) if r["seconds"] else 0.0 for r in ranks],
        "cached_steps": [r["cached_steps"] for r in ranks],
        # cache-dit's residual-difference statistic per step, as each rank computed it: one value on every rank
        # (the reduced whole sequence's), never a shard's own
        "residual_diffs": [r.get("residual_diffs", {}) for r in ranks],
        "contexts": [r["contexts"] for r in ranks],  # per stage: the cache's contexts as each rank saw them
        "stage_splits": ranks[0].get("splits", {}),  # per stage: "cfg" or "ulysses", as the workers ran it
        "ranks_agree": all((r["cached_steps"], r.get("residual_diffs")) == (ranks[0]["cached_steps"],
                                                                           ranks[0].get("residual_diffs"))
                           for r in ranks),
    }
