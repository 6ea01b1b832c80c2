"""The parallel plan: one run on several workers, each expert's token sequence split across them (Ulysses
sequence parallelism around self-attention) and, at a stage whose CFG is above 1, each evaluation's two prompts
on different workers (CFG parallel), the two together as a mesh from four workers on. Pure: which devices, how
the workers group, how the sequence and the heads divide, what the report says; the workers themselves are
glue (nodes/parallel/)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import Wan22InputError

MAX_WORKERS = 64
AUTO = "auto"
DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
INSTALL = "pip install 'ray>=2.60' yunchang (into ComfyUI's Python), then restart ComfyUI"


# How a stage's work is shared: "ulysses" splits each sequence over every worker; "cfg" gives the positive and
# the negative prompt of each evaluation to different halves of the workers, at a stage whose CFG is above 1
# (two workers: one prompt each; four or more: a mesh, each half splitting its prompt's sequence with Ulysses).
# At CFG 1 there is one prompt: the stage splits its sequence. "auto" picks per stage.
SPLITS = ("auto", "ulysses", "cfg")
SAVED_SPLIT = "ulysses"  # what workflows saved before the split input run with
PROMPTS = 2  # an evaluation above CFG 1 has two prompts (positive, negative): the CFG split's degree


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
        """What a stage at this CFG uses: "cfg" (its two prompts on the two halves of the workers) or
        "ulysses"."""
        return "cfg" if self.split in ("auto", "cfg") and float(cfg) > 1.0 and self.workers % PROMPTS == 0 \
            else "ulysses"

    def splits_sequence(self, cfg: float) -> bool:
        """Whether a stage at this CFG cuts each prompt's token sequence across workers (Ulysses, alone or in each
        half of a CFG mesh): a worker then holds a shard of every hidden state."""
        return self.workers // (PROMPTS if self.stage_split(cfg) == "cfg" else 1) > 1


# Calibrators whose forecast of a tensor is not the forecasts of its parts: DMD fits one exponential model to the
# whole of each prompt's hidden state (an SVD), so a worker's shard would forecast otherwise than one process.
# TaylorSeer and FoCa forecast element by element.
WHOLE_STATE_CALIBRATORS = ("dmd",)


def refuse_calibrator(plan: ParallelPlan, calibrator: str, stage_cfg: dict) -> None:
    """Refuses, naming `calibrator`, a calibrator the plan would run on shards of the sequence."""
    cut = sorted(stage for stage, cfg in stage_cfg.items() if plan.splits_sequence(cfg))
    if calibrator in WHOLE_STATE_CALIBRATORS and cut:
        raise Wan22InputError("calibrator", f"{calibrator} fits each prompt's whole hidden state, and the parallel "
                                            f"plan cuts the sequence across workers at {', '.join(cut)}: use "
                                            "taylorseer or foca (they forecast element by element), or run "
                                            "without the parallel plan")


def mesh_groups(world: int, prompts: int) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of a mesh of `prompts` x (world / prompts): the sequence groups (the ranks that split one
    prompt's sequence: consecutive ranks) and the prompt groups (one rank of each sequence group, at the same
    place in it: the ranks whose outputs make one call's batch)."""
    sequence = world // prompts
    return ([list(range(p * sequence, (p + 1) * sequence)) for p in range(prompts)],
            [list(range(q, world, sequence)) for q in range(sequence)])


def mesh_place(rank: int, world: int, prompts: int) -> tuple[int, int]:
    """(the prompt this rank runs, its place in that prompt's sequence group)."""
    sequence = world // prompts
    return rank // sequence, rank % sequence


def local_heads(heads: int, degree: int) -> int:
    """The heads each worker attends with: the heads padded with empty ones up to a multiple of the degree (an
    empty head attends to nothing and is dropped), so any degree splits any head count."""
    return -(-heads // degree)


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


def make_plan(*, workers: int, devices: str, ulysses_degree: int, cpu_threads: int, gpus: int,
              cpus: int, cluster: bool = False, split: str = SAVED_SPLIT) -> ParallelPlan:
    """The plan, every value checked and refused by its input name before any worker starts: no more CPU
    workers or threads than the cores, no GPU this process does not see (see parse_devices)."""
    workers, degree = int(workers), int(ulysses_degree)
    if split not in SPLITS:
        raise Wan22InputError("split", f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if split == "cfg" and int(workers) % PROMPTS:
        raise Wan22InputError("split", f"the CFG split shares the two prompts of each evaluation between two "
                                       f"halves of the workers, and {workers} workers do not halve: use an even "
                                       "number of workers, or the 'ulysses' or 'auto' split")
    if not 2 <= workers <= MAX_WORKERS:
        raise Wan22InputError("workers", f"{workers} workers: use between 2 and {MAX_WORKERS} (one run on one "
                                         "device needs no plan)")
    devices = parse_devices(devices, workers, gpus=gpus, cpus=cpus, cluster=cluster)
    if degree < 2:
        raise Wan22InputError("ulysses_degree", f"{degree} splits nothing: the degree is how many workers share "
                                                f"each sequence; set it to the number of workers ({workers})")
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
    """Every worker needs a token of the sequence (a shard may be one token longer than another)."""
    if tokens < degree:
        raise Wan22InputError("ulysses_degree", f"the video's {tokens} tokens (latent frames x height/16 x "
                                                f"width/16) are fewer than the {degree} workers that split each "
                                                "sequence: use fewer workers, or a larger video")


def shard_sizes(tokens: int, degree: int) -> list[int]:
    """Each worker's share of a sequence, in rank order: equal where the degree divides it, else the first
    `tokens % degree` workers take one token more."""
    size, rest = divmod(tokens, degree)
    return [size + (rank < rest) for rank in range(degree)]


def shard(tokens: int, degree: int, rank: int) -> slice:
    sizes = shard_sizes(tokens, degree)
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def statistic_weight(tokens: int, degree: int, rank: int) -> float:
    """What a worker's mean over its shard is weighed by so that the plain average over the workers (cache-dit's
    statistic, reduced over the ranks with AVG) is the whole sequence's mean: 1 for equal shards."""
    return degree * shard_sizes(tokens, degree)[rank] / tokens


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
        # per stage: "cfg" (the prompts split, and with four or more workers each prompt's sequence: "cfg+ulysses")
        # or "ulysses", as the workers ran it; "cfg, ulysses" where some calls carried one prompt
        "stage_splits": ranks[0].get("splits", {}),
        "ranks_agree": all((r["cached_steps"], r.get("residual_diffs")) == (ranks[0]["cached_steps"],
                                                                           ranks[0].get("residual_diffs"))
                           for r in ranks),
    }
