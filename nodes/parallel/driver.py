"""The Ray driver of a parallel plan's workers, in a process of its own: pool.Pool starts one per pool and
talks to it over two pipes. It connects to Ray (a local cluster in the folder the pool gives it, or the cluster
at RAY_ADDRESS), starts the workers (actor.py), and relays runs, progress and interrupts between them and
ComfyUI. ComfyUI's process never connects to Ray, so nothing Ray's client keeps (its log files, gRPC sockets and
threads, which outlive ray.shutdown) stays in ComfyUI: it goes when this process ends, which it does when its
pool is released, or by itself once ComfyUI is gone (its pipe closed), after stopping the workers and the local
cluster.

It runs as a script with the standard library, Ray and psutil only: ComfyUI's objects cross it as bytes,
pickled by ComfyUI and unpickled by the workers, and the workers answer with bytes and a word for the driver
(worker.Worker.run).

Messages from ComfyUI: ("run", run id, job bytes), ("interrupt", run id), ("stop",). To ComfyUI: first
("ready", {"pids", "gcs_address"}) or ("refused", text) or ("failed", text); for a run, ("progress", (bar,
value, total)) any number of times, then ("done", [answer bytes per rank]) or ("error", {...}); ("stopped",).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import time
from multiprocessing.connection import Connection

POLL_S = 0.2  # how often a run looks at its workers and at ComfyUI's pipe
GRACE_S = 10  # how long the other workers may take to answer once one has failed
# What a worker's failure was, as it says it (worker.py): a refusal or an interrupt that every worker made at
# the same call leaves the group in a known state; anything else, or a worker gone, releases the workers.
SAFE = ("refusal", "interrupt")


def sibling(name: str):
    """A module beside this one, loaded by its path (this script runs with no package: see the module's text) as
    wan22_parallel_<name>, which the actor imports under that name too; Ray sends it to the workers by value."""
    import ray

    module_name = f"wan22_parallel_{name}"
    if module_name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        ray.cloudpickle.register_pickle_by_value(module)  # the workers cannot import it by this name
    return sys.modules[module_name]


try:
    from . import auth
except ImportError:  # run as a script (pool.Pool starts it so), with no package: auth.py beside it, by its path
    auth = sibling("auth")


class Gone(Exception):
    """ComfyUI's end of the pipe closed: ComfyUI is gone, and the workers go with it."""


def stop_processes(processes: list, grace_s: float = 3.0) -> None:
    """Terminate what is still running of these processes after `grace_s`, then kill what ignores that."""
    import psutil

    alive = processes
    for stop in (psutil.Process.terminate, psutil.Process.kill):
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
        for process in alive:
            try:
                stop(process)
            except psutil.Error:
                pass


class Driver:
    def __init__(self, incoming: Connection, outgoing: Connection, config: dict):
        self.incoming, self.outgoing, self.config = incoming, outgoing, config
        self.ray = None
        self.actors, self.store = [], None

    def send(self, message) -> None:
        self.outgoing.send(message)

    # --- start ---

    def start(self) -> dict:
        import ray

        self.ray = ray
        config = self.config
        if config["address"]:  # join that cluster: stopping disconnects and leaves it up
            ray.init(address=config["address"], include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        else:  # a new local cluster with only what the plan needs, in the pool's folder
            ray.init(address="local", num_cpus=config["num_cpus"] * len(config["devices"]) + 1,
                     num_gpus=config["num_gpus"], include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, _temp_dir=config["temp_dir"])
        auth.private_token()
        actor_module = sibling("actor")
        self.store = ray.remote(actor_module.Rendezvous).options(num_cpus=0).remote()
        auth.check_connected(lambda: ray.get(self.store.authentication.remote(), timeout=config["boot_timeout_s"]))
        actor = ray.remote(actor_module.ParallelActor)
        world = len(config["devices"])
        for rank, device in enumerate(config["devices"]):
            self.actors.append(actor.options(num_cpus=config["num_cpus"], num_gpus=1 if device == "cuda" else 0,
                                             max_concurrency=4)
                               .remote(rank, world, device, config["cpu_threads"], config["comfy_root"]))
        boots = [a.boot.remote(config["pack_dir"], config["pack_name"], config["comfy_args"], self.store,
                               config["loopback"]) for a in self.actors]
        deadline = time.monotonic() + config["boot_timeout_s"]
        pending = list(boots)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                ray.get(ref)  # a worker that failed to start fails the start, with its error
            if pending and time.monotonic() > deadline:
                ranks = ", ".join(str(boots.index(r)) for r in pending)
                raise RuntimeError(f"worker(s) {ranks} did not start in {config['boot_timeout_s']} s")
            self.check_comfy()
        return {"pids": ray.get(boots), "gcs_address": ray.get_runtime_context().gcs_address}

    def check_comfy(self, run_id=None, on_interrupt=None) -> None:
        """Reads what ComfyUI sent meanwhile: an interrupt of this run; a stop or a closed pipe ends the driver."""
        while self.incoming.poll(0):
            try:
                message = self.incoming.recv()
            except (EOFError, OSError):
                raise Gone() from None
            if message[0] == "stop":
                raise Gone()
            if message[0] == "interrupt" and message[1] == run_id and on_interrupt is not None:
                on_interrupt()

    # --- runs ---

    def answer(self, ref) -> tuple:
        """A worker's (word, bytes, text): "ok" and its answer, a failure it reported, or "gone"."""
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            return "gone", None, type(e).__name__
        except Exception as e:
            return "failed", None, f"{type(e).__name__}: {e}"

    def run(self, run_id: str, job: bytes) -> None:
        ray = self.ray
        job_ref = ray.put(job)
        refs = [a.run.remote(job_ref) for a in self.actors]
        interrupted, seen = [], None

        def interrupt():
            if not interrupted:
                interrupted.append(True)
                for a in self.actors:
                    a.interrupt.remote(run_id)

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                answer = self.answer(ref)
                if answer[0] != "ok":
                    return self.send(("error", self.failed(refs, ref, answer)))
            self.check_comfy(run_id, interrupt)
            if pending:
                try:
                    progress = ray.get(self.actors[0].progress.remote(), timeout=5)
                except Exception:
                    continue  # a worker gone: the wait names it
                if progress is not None and progress != seen:
                    seen = progress
                    self.send(("progress", progress))
        self.send(("done", [self.answer(ref)[1] for ref in refs]))

    def failed(self, refs, first, answer) -> dict:
        """What ComfyUI is told of a run a worker failed. The others are given a moment to answer: a worker
        gone is named (the workers are then released), and so is the first failure; only a refusal or an
        interrupt that every worker made leaves them usable (`release`: False)."""
        ray = self.ray
        others = [r for r in refs if r is not first]
        _, late = ray.wait(others, num_returns=len(others), timeout=GRACE_S)
        answers = {refs.index(first): answer}
        answers.update({refs.index(r): self.answer(r) for r in others if r not in late})
        failures = {rank: a for rank, a in answers.items() if a[0] != "ok"}
        gone = sorted(rank for rank, a in failures.items() if a[0] == "gone")
        if gone:
            return {"rank": gone[0], "kind": "gone", "payload": None, "text": failures[gone[0]][2], "release": True}
        rank = refs.index(first)
        kind, payload, text = answer
        same = len(failures) == len(refs) and all(a[0] == kind for a in failures.values())
        return {"rank": rank, "kind": kind, "payload": payload, "text": text,
                "release": not (kind in SAFE and same)}

    # --- stop ---

    def cluster_processes(self) -> list:
        """The processes of the local cluster this driver started: its children that work in the cluster's
        folder (GCS, raylet, ...) and everything they started (agents, workers). Ray's agents outlive its
        shutdown by about a minute otherwise."""
        import psutil

        folder = self.config["temp_dir"]  # None for a joined cluster (RAY_ADDRESS), which stays up
        if not folder:
            return []
        found = {}
        for child in psutil.Process().children():
            try:
                if folder in " ".join(child.cmdline()):
                    found.update({p.pid: p for p in (child, *child.children(recursive=True))})
            except psutil.Error:
                pass
        return list(found.values())

    def stop(self) -> None:
        ray = self.ray
        if ray is None:
            return
        for a in [*self.actors, *([self.store] if self.store is not None else [])]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        cluster = self.cluster_processes()
        if ray.is_initialized():
            ray.shutdown()  # stops the local cluster; only disconnects from a joined one
        stop_processes(cluster)
        if self.config["temp_dir"]:
            shutil.rmtree(self.config["temp_dir"], ignore_errors=True)

    # --- the loop ---

    def serve(self) -> None:
        try:
            try:
                ready = self.start()
            except Gone:
                return
            except Exception as e:
                refused = isinstance(e, auth.Refused)
                self.send(("refused" if refused else "failed", str(e) if refused else f"{type(e).__name__}: {e}"))
                self.wait_for_stop()
                return
            self.send(("ready", ready))
            while True:
                try:
                    message = self.incoming.recv()
                except (EOFError, OSError):
                    return
                if message[0] == "stop":
                    return
                if message[0] == "run":
                    self.run(message[1], message[2])
        except Gone:
            return
        finally:
            self.stop()
            try:
                self.send(("stopped",))
            except OSError:
                pass

    def wait_for_stop(self) -> None:
        try:
            while self.incoming.recv()[0] != "stop":
                pass
        except (EOFError, OSError):
            pass


def main() -> int:
    incoming = Connection(int(sys.argv[1]), writable=False)
    outgoing = Connection(int(sys.argv[2]), readable=False)
    config = incoming.recv()  # plain values; ComfyUI's options as bytes the workers unpickle
    Driver(incoming, outgoing, config).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
