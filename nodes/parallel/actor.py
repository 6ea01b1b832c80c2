"""The Ray actor that is one worker: a process of its own that starts its own ComfyUI, joins the run's
torch.distributed group and serves the runs of one parallel plan.

Ray ships this class to the worker by value (the pack's module names are ComfyUI's, not importable there or in
the driver, driver.py), so it imports nothing but the standard library here; everything else is imported
in the worker, after `boot` has put ComfyUI and the pack on its path under the names ComfyUI gave them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from datetime import timedelta

try:
    from .auth import token_mode
except ImportError:  # loaded by the driver by its path, with auth.py loaded beside it (driver.sibling)
    from wan22_parallel_auth import token_mode

# A collective that waits this long for a rank has lost it (the driver releases the workers well before).
GROUP_TIMEOUT_S = 600


class Rendezvous:
    """The group's rendezvous store, kept in a Ray actor: the workers exchange their addresses through Ray's
    authenticated channel, and no store listens on a port of its own (worker.RayStore is the
    torch.distributed side)."""

    def __init__(self):
        self.keys: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.keys[key] = value

    def get(self, key: str):
        return self.keys.get(key)

    def add(self, key: str, amount: int) -> int:
        value = int(self.keys.get(key, b"0")) + amount
        self.keys[key] = str(value).encode()
        return value

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.keys.get(key)
        if (current is None and not expected) or current == expected:
            self.keys[key] = desired
            return desired
        return expected if current is None else current

    def delete_key(self, key: str) -> bool:
        return self.keys.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.keys)

    def authentication(self) -> str:
        """The token authentication of the cluster's worker processes, as Ray reports it here (auth.token_mode)."""
        return token_mode()


class ParallelActor:
    def __init__(self, rank: int, world: int, device: str, threads: int, comfy_root: str):
        self.rank, self.world, self.device, self.threads = rank, world, device, threads
        if device.startswith("cuda:"):  # a pinned GPU: this process sees only it, as cuda:0
            os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        if comfy_root not in sys.path:  # before any call whose arguments hold ComfyUI's objects
            sys.path.insert(0, comfy_root)
        self.worker = self.store = None

    def boot(self, pack_dir: str, pack_name: str, comfy_args: bytes, store, loopback: str | None) -> int:
        """ComfyUI and the pack in this process, then the group: its rendezvous through `store` (a Rendezvous
        actor), and, for a pool on one machine, the transport's sockets on the `loopback` interface only.
        `comfy_args`: the options of ComfyUI's own process, pickled (they hold ComfyUI's own types)."""
        if loopback is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = loopback
        import torch

        if self.device == "cpu":
            torch.set_num_threads(self.threads)
        from comfy.cli_args import args
        from ray import cloudpickle

        for name, value in cloudpickle.loads(comfy_args).items():  # ComfyUI's options there (dtypes, attention, ...)
            setattr(args, name, value)
        args.cpu, args.cuda_device = self.device == "cpu", None
        if pack_name not in sys.modules:  # the pack, under the name ComfyUI gave it
            spec = importlib.util.spec_from_file_location(pack_name, os.path.join(pack_dir, "__init__.py"),
                                                          submodule_search_locations=[pack_dir])
            module = importlib.util.module_from_spec(spec)
            sys.modules[pack_name] = module
            spec.loader.exec_module(module)
        worker = importlib.import_module(f"{pack_name}.nodes.parallel.worker")
        import torch.distributed as dist

        # Kept here: torch.distributed holds only the C++ side of a store written in Python, and calls its methods
        # through the Python object (a group made later, the CFG split's, fails with "Not implemented" once the
        # object is gone).
        self.store = worker.RayStore(store)
        dist.init_process_group("gloo" if self.device == "cpu" else "nccl", store=self.store,
                                rank=self.rank, world_size=self.world, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        self.worker = worker.Worker(self.rank, self.world)
        return os.getpid()

    def run(self, job: bytes) -> tuple:
        return self.worker.run(job)

    def interrupt(self, run: str) -> None:
        self.worker.cancel(run)

    def progress(self):
        return None if self.worker is None else self.worker.progress
