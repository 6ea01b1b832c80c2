"""What one worker process does (imported there, after its ComfyUI is up): it loads the experts itself from
the same files, through the same loader factory the MODELs came from (ComfyUI's `cached_patcher_init`, the
one its MultiGPU clones use), keeps them loaded between runs, puts each run's weight patches (LoRAs) on its
own clones, and runs the run's stages with ComfyUI's own sampling, as one process would, with its share of
every sequence (sequence.py)."""

from __future__ import annotations

import threading
import time

import comfy.model_management
import comfy.utils
import ray
import torch
import torch.distributed as dist

from .. import engine
from ..core.errors import Wan22InputError
from .rebuild import rebuilt
from .sequence import SequenceParallel, meshes

STORE_POLL_S = 0.01  # how often a waiting rank looks for a key another rank has yet to set


def as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class RayStore(dist.Store):
    """torch.distributed's rendezvous store over a Rendezvous actor (actor.py): every key goes through
    Ray, so only a process of the cluster (authenticated by Ray's token) reads or writes it."""

    def __init__(self, actor, timeout_s: float = 600.0):
        super().__init__()
        self.actor, self.timeout_s = actor, timeout_s

    def call(self, method: str, *args):
        return ray.get(getattr(self.actor, method).remote(*args))

    def set(self, key, value) -> None:
        self.call("set", key, as_bytes(value))

    def get(self, key) -> bytes:
        self.wait([key])
        return self.call("get", key)

    def add(self, key, amount) -> int:
        return self.call("add", key, int(amount))

    def compare_set(self, key, expected, desired) -> bytes:
        return self.call("compare_set", key, as_bytes(expected), as_bytes(desired))

    def check(self, keys) -> bool:
        return all(self.call("get", key) is not None for key in keys)

    def wait(self, keys, timeout=None) -> None:
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        deadline = time.monotonic() + limit
        for key in keys:
            while self.call("get", key) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the rendezvous key {key!r} was not set within {limit:.0f} s")
                time.sleep(STORE_POLL_S)

    def delete_key(self, key) -> bool:
        return self.call("delete_key", key)

    def num_keys(self) -> int:
        return self.call("num_keys")


class Worker:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.loaded: dict[str, object] = {}  # loader factory -> the model it made, kept warm between runs
        self.cancelled_run = None  # the id of the last run the driver cancelled (a cancel may come first)
        self.progress = None  # (bar, step, steps) of rank 0's sampling
        self.running = threading.Lock()  # one run at a time (the actor answers progress and interrupt meanwhile)
        self.meshes = meshes(rank, world)  # the process groups of the CFG split, made once (every rank, in order)

    def model(self, spec: dict):
        """A clone of this worker's own copy of the expert, with the run's weight patches."""
        base = self.loaded.get(spec["key"])
        if base is None:
            init = spec["init"]
            base = init[0](*init[1])
            if len(init) > 2:
                base = base[init[2]]
            self.loaded[spec["key"]] = base
        return rebuilt(base, spec)

    def on_progress(self, value, total, _preview=None, node_id=None):
        """ComfyUI's progress bar hook: each stage's bar counts up from the start, so a value below the last
        one, or another total, is the next stage's bar."""
        last = self.progress
        bar = 0 if last is None else last[0] + (value < last[1] or total != last[2])
        self.progress = (bar, int(value), int(total))

    def run(self, job: bytes) -> tuple:
        """(word, bytes, text) for the driver, which imports none of ComfyUI's or the pack's types: ("ok", the
        answer), or a failure ("refusal", "interrupt" or "failed") with the exception, pickled when it can be,
        and its text."""
        try:
            with self.running:
                return "ok", ray.cloudpickle.dumps(self.run_one(ray.cloudpickle.loads(job))), ""
        except BaseException as e:
            kind = ("refusal" if isinstance(e, Wan22InputError) else
                    "interrupt" if isinstance(e, comfy.model_management.InterruptProcessingException) else "failed")
            try:
                payload = ray.cloudpickle.dumps(e)
            except Exception:
                payload = None
            return kind, payload, f"{type(e).__name__}: {e}"

    def cancel(self, run: str) -> None:
        self.cancelled_run = run

    def run_one(self, job: dict) -> dict:
        self.progress = None
        specs = [*job["specs"].values(), *([job["lead"]] if job.get("lead") is not None else [])]
        for key in set(self.loaded) - {spec["key"] for spec in specs}:  # experts no run of this plan uses now
            del self.loaded[key]
        models = {role: self.model(spec) for role, spec in job["specs"].items()}
        experts = job["experts"].replace(high=models.get("high"), low=models.get("low"))
        lead_model = self.model(job["lead"]) if job.get("lead") is not None else None
        split = SequenceParallel(self.rank, self.world, lambda: self.cancelled_run == job["run"], job.get("splits"),
                                 self.meshes)
        comfy.utils.set_progress_bar_global_hook(self.on_progress if self.rank == 0 else None)
        started = time.perf_counter()
        with torch.inference_mode():
            latent, record = engine.sample(experts, job["schedule"], job["positive"], job["negative"],
                                           job["latent"], job["seed"], job["cfg"], attach=split.attach,
                                           lead_model=lead_model)
        return {"latent": latent if self.rank == 0 else None, "record": record,
                "seconds": time.perf_counter() - started, "comm_seconds": split.comm_seconds,
                "contexts": split.contexts, "splits": split.stage_splits(),
                "cached_steps": {stage: stats.get("cached_steps", []) for stage, stats in record.cache.items()},
                "residual_diffs": {stage: stats.get("residual_diffs", {}) for stage, stats in record.cache.items()}}
