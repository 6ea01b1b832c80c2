"""The warm pool of this process: at most one, kept while runs use the same plan, and released when a run uses
another plan or none (dispatch.py), when ComfyUI frees memory or unloads its models (the pool stands in ComfyUI's
model management as one tiny model, whose unloading releases it), when ComfyUI exits, or on SIGTERM and SIGINT
(the handlers installed when the pack loads). A worker's failure releases it from pool.py.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading

import comfy.model_management
import comfy.patcher_extension

from ..core import parallel as core
from .pool import Pool

_POOL = None
_STARTING = None  # a pool while it starts (under _LOCK), for release_for_exit
_STAND_IN = None
_LOCK = threading.RLock()


class WorkersInComfy:
    """The workers as ComfyUI's model management sees them: one tiny model on ComfyUI's device, loaded while
    a pool is up, whose unloading (Unload Models, /free, or ComfyUI making room) releases the pool. One for the
    process, never freed: ComfyUI unloads it while it iterates its loaded models, and a model freed then would
    have ComfyUI's finalizer change that list under it."""

    def __init__(self):
        import comfy.model_patcher
        import torch

        device = comfy.model_management.get_torch_device()
        module = torch.nn.Module()
        module.register_buffer("workers", torch.zeros(1))
        self.patcher = comfy.model_patcher.ModelPatcher(module, load_device=device, offload_device=device)
        self.patcher.add_callback(comfy.patcher_extension.CallbacksMP.ON_DETACH, self.detached)

    def load(self) -> None:
        comfy.model_management.load_models_gpu([self.patcher])

    def remove(self) -> None:
        comfy.model_management.unload_model_and_clones(self.patcher)

    @staticmethod
    def detached(*_args) -> None:
        with _LOCK:
            pool = _POOL
        if pool is not None:
            pool.in_comfy = False  # ComfyUI is unloading it now
            pool.release()


def stand_in() -> WorkersInComfy:
    global _STAND_IN
    if _STAND_IN is None:
        _STAND_IN = WorkersInComfy()
    return _STAND_IN


def pool_for(plan: core.ParallelPlan) -> Pool:
    """The warm pool of this plan, or a new one (the old pool released first)."""
    global _POOL
    with _LOCK:
        if _POOL is not None and _POOL.plan != plan:
            _POOL.release()
        if _POOL is None:
            _POOL = start(plan)
        return _POOL


def start(plan: core.ParallelPlan) -> Pool:
    """A new pool with its stand-in loaded in ComfyUI; released if either fails."""
    global _STARTING
    pool = _STARTING = Pool(plan, _LOCK, stopped)
    try:
        pool.start()
        stand_in().load()
        pool.in_comfy = True
    except BaseException:
        pool.release()
        raise
    finally:
        _STARTING = None
    return pool


def stopped(pool: Pool) -> None:
    """A pool has stopped (Pool.stop): it is no longer the warm one, and its stand-in leaves ComfyUI."""
    global _POOL
    if _POOL is pool:
        _POOL = None
    if pool.in_comfy:
        pool.in_comfy = False
        stand_in().remove()


def release() -> None:
    """Releases the warm workers, if any (a run without a plan, ComfyUI unloading models, exit)."""
    with _LOCK:
        if _POOL is not None:
            _POOL.release()


atexit.register(release)


def release_for_exit() -> None:
    """Stops the workers and the local cluster as ComfyUI exits, the warm pool's and one starting (whose
    start holds the pool's lock: the process is ending, so this does not wait for it)."""
    for pool in {id(p): p for p in (_POOL, _STARTING) if p is not None}.values():
        pool.stop()


def release_on_termination() -> None:
    """SIGTERM ends Python without its exit handlers, and SIGINT's KeyboardInterrupt reaches them only once
    ComfyUI has wound down: the workers and the local Ray cluster would outlive ComfyUI, or keep it waiting.
    These handlers release them first, then do what was there before (terminate; raise KeyboardInterrupt). They
    are installed once, from the main thread, when the pack loads (a signal handler can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if getattr(previous, "wan22_release", False):
            continue

        def on_signal(number, frame, previous=previous):
            release_for_exit()
            if callable(previous):
                previous(number, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)

        on_signal.wan22_release = True
        signal.signal(signum, on_signal)
