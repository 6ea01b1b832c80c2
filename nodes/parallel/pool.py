"""One parallel plan's workers, from ComfyUI's side: the link to their Ray driver (driver.py), a process of its
own that Pool starts and talks to over two pipes, so that ComfyUI's process never connects to Ray and what Ray's
client keeps goes with that process. A Pool starts the driver (with what launch.py says the workers need),
relays a run and its progress and interrupts, and
stops the driver, which stops the workers and the local Ray cluster. Which pool is warm, and when it is released,
is registry.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import Connection
from typing import Callable

import comfy.model_management
import comfy.utils

from . import auth, driver as parallel_driver, launch
from ..core import parallel as core
from ..core.errors import Wan22InputError
from .gate import ray_module

POLL_S = 0.2  # how often a run looks at the driver's pipe (and at ComfyUI's interrupt)
BOOT_TIMEOUT_S = 600  # a hang guard only: each worker imports torch and ComfyUI first
GRACE_S = parallel_driver.GRACE_S  # how long the other workers may take to answer once one has failed
STOP_S = 60  # a hang guard only: the driver stops the workers and the cluster within seconds
# The driver as a script, with neither the working folder nor its own (the pack's nodes/, whose types.py would
# shadow Python's) on its path.
DRIVER_MAIN = ("import runpy, sys; del sys.path[0]; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")


class Pool:
    """The workers of one plan, driven by a Ray driver in a process of its own (driver.py), over two
    pipes: ComfyUI's process never connects to Ray."""

    def __init__(self, plan: core.ParallelPlan, lock: threading.RLock, on_stop: Callable[["Pool"], None]):
        self.plan = plan
        self.lock = lock  # the registry's: a release waits for a pool starting or stopping
        self.on_stop = on_stop  # told once the pool has stopped (registry.py)
        self.driver = None  # the driver's process
        self.incoming = self.outgoing = None  # the pipes from and to it
        self.sending = threading.Lock()  # a run's interrupt and a release may write at once
        self.pids, self.gcs_address = [], None
        self.released = False
        self.in_comfy = False  # whether the registry's stand-in is loaded in ComfyUI for this pool
        self.temp_dir = None

    def start(self) -> None:
        """Starts the driver and, through it, the workers; fails (the caller releases) if they do not start."""
        ray, plan = ray_module(), self.plan
        address = os.environ.get("RAY_ADDRESS")
        try:
            auth.check_before_start(ray.__version__, cluster=bool(address))
        except auth.Refused as refused:
            raise Wan22InputError("workers", str(refused)) from None
        # a local cluster's own folder (its session, sockets and logs), removed on release
        self.temp_dir = None if address else tempfile.mkdtemp(prefix="wan22-ray-")
        config = launch.driver_config(plan, address, self.temp_dir, ray.cloudpickle.dumps(launch.comfy_args()),
                                      BOOT_TIMEOUT_S)
        self.start_driver(config)
        kind, answer = self.receive(deadline=time.monotonic() + BOOT_TIMEOUT_S + GRACE_S)
        if kind == "refused":
            raise Wan22InputError("workers", answer)
        if kind != "ready":
            raise RuntimeError(f"the workers did not start: {answer}")
        self.pids, self.gcs_address = answer["pids"], answer["gcs_address"]

    def start_driver(self, config: dict) -> None:
        to_driver, from_driver = os.pipe(), os.pipe()
        try:
            self.driver = subprocess.Popen([sys.executable, "-c", DRIVER_MAIN, parallel_driver.__file__,
                                            str(to_driver[0]), str(from_driver[1])],
                                           pass_fds=(to_driver[0], from_driver[1]), stdin=subprocess.DEVNULL)
        finally:
            os.close(to_driver[0])
            os.close(from_driver[1])
        self.outgoing = Connection(to_driver[1], readable=False)
        self.incoming = Connection(from_driver[0], writable=False)
        self.send(config)

    def send(self, message) -> None:
        with self.sending:
            if self.outgoing is not None:
                self.outgoing.send(message)

    def receive(self, deadline=None, on_poll=None) -> tuple:
        """The driver's next message. Its process gone, or no message by `deadline` (a hang guard), fails."""
        while True:
            self.alive()
            try:
                if self.incoming.poll(POLL_S):
                    message = self.incoming.recv()
                    return message[0], (message[1] if len(message) > 1 else None)
            except (EOFError, OSError):
                self.alive()
                self.release()
                raise RuntimeError(f"the workers' driver (process {self.driver.pid}) stopped "
                                   f"(exit {self.driver.poll()}); the workers were released") from None
            if deadline is not None and time.monotonic() > deadline:
                self.release()
                raise RuntimeError(f"the workers did not answer in {BOOT_TIMEOUT_S} s; they were released")
            if on_poll is not None:
                on_poll()

    def alive(self) -> None:
        """Raises once the pool was released (ComfyUI exiting, or a release from another thread)."""
        if self.released:
            raise RuntimeError("the workers were released (ComfyUI is exiting, or their memory was freed)")

    def describe(self, rank: int) -> str:
        return f"worker {rank} ({self.plan.devices[rank]})"

    def failure(self, failed: dict) -> BaseException:
        """The error of a run a worker failed, as the driver reports it (driver.Driver.failed): a worker
        gone is named with its device; a refusal or an interrupt every worker made leaves them usable; anything
        else releases them (the others may be waiting in a collective for the one that failed)."""
        rank = failed["rank"]
        if failed["release"]:
            self.release()
        if failed["kind"] == "gone":
            return Wan22InputError("workers", f"{self.describe(rank)} stopped mid-run ({failed['text']}); the "
                                              "workers were released, and the next run starts fresh ones")
        if failed["payload"] is not None:
            try:
                return ray_module().cloudpickle.loads(failed["payload"])
            except Exception:
                pass
        return RuntimeError(f"{self.describe(rank)} failed: {failed['text']}"
                            + ("; the workers were released" if failed["release"] else ""))

    def run(self, job: dict) -> list[dict]:
        ray = ray_module()
        run_id = uuid.uuid4().hex  # a cancel names its run: one that comes late cancels no other
        state = {"bar": None, "interrupted": False}

        def interrupt():
            if not state["interrupted"]:
                state["interrupted"] = True
                self.send(("interrupt", run_id))

        def on_poll():
            if comfy.model_management.processing_interrupted():
                interrupt()

        finished = False
        try:
            self.alive()
            self.send(("run", run_id, ray.cloudpickle.dumps({**job, "run": run_id})))
            while True:
                kind, answer = self.receive(on_poll=on_poll)
                if kind == "progress":
                    bar, value, total = answer
                    if state["bar"] is None or state["bar"][0] != bar:
                        state["bar"] = (bar, comfy.utils.ProgressBar(total))
                    try:
                        state["bar"][1].update_absolute(value, total)
                    except comfy.model_management.InterruptProcessingException:
                        interrupt()  # ComfyUI's server hook raises it for a cancel: the workers stop together
                    continue
                finished = True
                if kind == "error":
                    raise self.failure(answer)
                if kind != "done":
                    raise RuntimeError(f"the workers' driver answered {kind!r}")
                break
            if state["interrupted"]:  # cancelled after the workers' last agreement: still a cancel
                raise comfy.model_management.InterruptProcessingException()
            return [ray.cloudpickle.loads(a) for a in answer]
        except comfy.model_management.InterruptProcessingException:
            comfy.model_management.interrupt_current_processing(False)  # taken, as ComfyUI's own check does
            if not finished:
                self.release()
            raise
        except BaseException:
            if not finished:
                self.release()  # never leave a run going behind the next one
            raise

    def release(self) -> None:
        """Stops the workers, the local cluster and the driver; safe to call more than once."""
        with self.lock:
            self.stop()

    def stop(self, within_s: float = STOP_S) -> None:
        """What release does, without the pool's lock: at exit a pool may be starting under it. The driver
        stops the workers and the cluster itself; one that does not within `within_s` (a hang guard) is
        ended with everything it started. The registry is told last (on_stop)."""
        if self.released:
            return
        self.released = True
        try:
            self.stop_driver(within_s)
        finally:
            self.on_stop(self)

    def stop_driver(self, within_s: float) -> None:
        if self.driver is not None:
            try:
                self.send(("stop",))
            except OSError:
                pass
            try:
                self.driver.wait(timeout=within_s)
            except subprocess.TimeoutExpired:
                import psutil

                try:
                    tree = [psutil.Process(self.driver.pid)]
                    tree += tree[0].children(recursive=True)
                except psutil.Error:
                    tree = []
                parallel_driver.stop_processes(tree, grace_s=0)
                self.driver.wait()
            for connection in (self.outgoing, self.incoming):
                if connection is not None:
                    connection.close()
            self.outgoing = self.incoming = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
