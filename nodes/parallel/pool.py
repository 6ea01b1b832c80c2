"""The workers of a parallel plan, from ComfyUI's side: Ray actors (actor.py), one per device, in one
torch.distributed group, started for a plan and kept warm (their experts loaded) while runs use the same plan.
A Ray driver in a process of its own (driver.py) starts and serves them: ComfyUI's process never connects
to Ray, and what Ray's client keeps goes with that process.

They are released when a run uses another plan or none, when ComfyUI frees memory or unloads its models (they
stand in ComfyUI's model management as one tiny model, whose unloading releases them), when a worker fails,
and when ComfyUI exits (or is killed: the driver sees its pipe close). A local Ray cluster is started with only
what the plan needs, and stopped with the workers; with RAY_ADDRESS set, the workers join that cluster instead
(several machines), which stays up.

What crosses to the workers is small: each expert's loader factory (ComfyUI's `cached_patcher_init`: the
file and its options), the run's weight patches (LoRAs), the schedule, the conditioning and the latent. The
experts' weights never do: each worker loads them itself.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import Connection

import comfy.model_management
import comfy.patcher_extension
import comfy.utils

from . import actor as parallel_actor, driver as parallel_driver
from .rebuild import ATTENTION_OVERRIDE, sent_attachments, unrebuildable
from ..core import parallel as core
from ..core.errors import Wan22InputError
from ..core.experts import ROLE_WORDS

POLL_S = 0.2  # how often a run looks at the driver's pipe (and at ComfyUI's interrupt)
BOOT_TIMEOUT_S = 600  # a hang guard only: each worker imports torch and ComfyUI first
GRACE_S = parallel_driver.GRACE_S  # how long the other workers may take to answer once one has failed
STOP_S = 60  # a hang guard only: the driver stops the workers and the cluster within seconds
# The driver as a script, with neither the working folder nor its own (the pack's nodes/, whose types.py would
# shadow Python's) on its path.
DRIVER_MAIN = ("import runpy, sys; del sys.path[0]; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
# Conditioning entries that carry models or Python objects of their own, which a worker cannot rebuild.
WORKERLESS_CONDITIONING = ("control", "hooks", "gligen")
# Set to 1 to run the workers on a Ray cluster without token authentication (anyone who can reach its ports can
# then run code as this user): refused otherwise.
WITHOUT_AUTH = "WAN22_RAY_WITHOUT_AUTH"
_POOL = None
_STARTING = None  # a pool while it starts (under _LOCK), for release_for_exit
_STAND_IN = None
_LOCK = threading.RLock()


def ray_module():
    try:
        import ray
        import yunchang  # noqa: F401  (the sequence-parallel all-to-all, imported by each worker)
    except ImportError as e:
        raise Wan22InputError("workers", f"the parallel plan needs Ray and yunchang ({e.name} is not installed): "
                                         f"{core.INSTALL}") from None
    return ray


# --- what the workers rebuild each expert from (rebuild.py) ---

def model_spec(model, role: str) -> dict:
    """How a worker makes the same MODEL: ComfyUI's loader factory for it, and its weight patches. A MODEL that
    carries anything else is refused before any worker starts, naming what."""
    what = f"the {ROLE_WORDS.get(role, role)} expert" if role != "lead" else "the lead stage's expert"
    init = getattr(model, "cached_patcher_init", None)
    if init is None:
        raise Wan22InputError("workers", f"{what} comes from a loader that does not tell ComfyUI how to load it again "
                                         "(its cached_patcher_init; GGUF loaders do not), so the workers cannot "
                                         "load it themselves: load it with Load Wan2.2 Experts, Load Diffusion "
                                         "Model or Load Wan2.2 Experts (Diffusers), or run without the plan")
    found = unrebuildable(model)
    if found:
        raise Wan22InputError("workers", f"{what} carries model patches the workers cannot rebuild "
                                         f"({', '.join(found[:4])}): remove the node that adds them, or run without "
                                         "the parallel plan")
    return {"init": init, "key": repr((getattr(init[0], "__module__", ""), getattr(init[0], "__qualname__", ""),
                                        init[1:])),
            "patches": {key: list(patches) for key, patches in model.patches.items()},
            "patches_uuid": model.patches_uuid, "attention": attention_override(model, what),
            "attachments": sent_attachments(model)}


def attention_override(model, what: str):
    """The MODEL's attention override, ready to be sent to the workers: the module that defines it (another
    custom node pack, which a worker does not load) goes by value. One that cannot be sent is refused by name."""
    override = model.model_options.get("transformer_options", {}).get(ATTENTION_OVERRIDE)
    if override is None:
        return None
    ray = ray_module()
    name = getattr(override, "__module__", None) or ""
    module = sys.modules.get(name)
    own = name.split(".")[0] in ("comfy", "comfy_extras", "comfy_api", __name__.split(".")[0])
    if module is not None and not own:
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        ray.cloudpickle.dumps(override)
    except Exception as e:
        raise Wan22InputError("workers", f"{what} carries an attention override "
                                         f"({getattr(override, '__qualname__', type(override).__name__)} from "
                                         f"{name or 'an unknown module'}) that cannot be sent to the workers "
                                         f"({type(e).__name__}: {e}): remove the node that sets it, or run "
                                         "without the parallel plan") from None
    return override


# --- what the pool exposes ---

def authentication_refusal(why: str) -> Wan22InputError:
    return Wan22InputError("workers", str(parallel_driver.authentication_refusal(why, WITHOUT_AUTH)))


def check_authentication(ray, cluster: bool) -> None:
    """Before anything starts: Ray must guard the cluster with its token authentication (its servers listen
    on every interface), unless the user opted out (WITHOUT_AUTH)."""
    if os.environ.get(WITHOUT_AUTH) == "1":
        return
    try:
        from ray._raylet import get_authentication_mode  # noqa: F401
    except ImportError:
        raise authentication_refusal(f"Ray {ray.__version__} predates token authentication") from None
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.strip().lower() != "token":
        where = "the Ray cluster at RAY_ADDRESS" if cluster else "the local Ray cluster"
        raise authentication_refusal(f"RAY_AUTH_MODE={mode} would run {where} without token authentication")


def loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 ('lo' on Linux), for the transport of a pool on one machine."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    return None


# --- the pool ---

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


def physical(device: str) -> str:
    """A pinned GPU as the driver's process sees it (cuda:N of its CUDA_VISIBLE_DEVICES), as the worker must
    name it (the physical GPU, which its own CUDA_VISIBLE_DEVICES then shows as cuda:0)."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if device.startswith("cuda:") and visible:
        index = int(device.split(":")[1])
        return f"cuda:{visible[index]}" if index < len(visible) else device
    return device


def comfy_root() -> str:
    import folder_paths

    return os.path.dirname(os.path.abspath(folder_paths.__file__))


def comfy_args() -> dict:
    from comfy.cli_args import args

    # the worker's own device, and no previews (the workers' progress carries none back)
    skip = {"listen", "port", "cpu", "cuda_device", "default_device", "cuda_malloc", "disable_cuda_malloc",
            "preview_method"}
    return {name: value for name, value in vars(args).items() if name not in skip}


class Pool:
    """The workers of one plan, driven by a Ray driver in a process of its own (driver.py), over two
    pipes: ComfyUI's process never connects to Ray."""

    def __init__(self, plan: core.ParallelPlan):
        global _STARTING
        ray = ray_module()
        self.plan = plan
        self.driver = None  # the driver's process
        self.incoming = self.outgoing = None  # the pipes from and to it
        self.sending = threading.Lock()  # a run's interrupt and a release may write at once
        self.pids, self.gcs_address = [], None
        self.released = False
        self.in_comfy = False  # whether the stand-in is loaded in ComfyUI for this pool
        address = os.environ.get("RAY_ADDRESS")
        check_authentication(ray, cluster=bool(address))
        cpu = plan.backend == "gloo"
        # a local cluster's own folder (its session, sockets and logs), removed on release
        self.temp_dir = None if address else tempfile.mkdtemp(prefix="wan22-ray-")
        config = {"address": address, "temp_dir": self.temp_dir, "devices": [physical(d) for d in plan.devices],
                  "num_cpus": plan.cpu_threads if cpu else 1,
                  "num_gpus": 0 if cpu else sum(d == "cuda" for d in plan.devices),
                  "cpu_threads": plan.cpu_threads, "comfy_root": comfy_root(),
                  "pack_dir": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                  "pack_name": __name__.rsplit(".nodes.", 1)[0], "comfy_args": ray.cloudpickle.dumps(comfy_args()),
                  "loopback": None if address else loopback_interface(), "boot_timeout_s": BOOT_TIMEOUT_S,
                  "without_auth": os.environ.get(WITHOUT_AUTH) == "1", "without_auth_variable": WITHOUT_AUTH,
                  "actor_path": parallel_actor.__file__}
        _STARTING = self
        try:
            self.start_driver(config)
            kind, answer = self.receive(deadline=time.monotonic() + BOOT_TIMEOUT_S + GRACE_S)
            if kind == "refused":
                raise Wan22InputError("workers", answer)
            if kind != "ready":
                raise RuntimeError(f"the workers did not start: {answer}")
            self.pids, self.gcs_address = answer["pids"], answer["gcs_address"]
            stand_in().load()
            self.in_comfy = True
        except BaseException:
            self.release()
            raise
        finally:
            _STARTING = None

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
        with _LOCK:
            self.stop()

    def stop(self, within_s: float = STOP_S) -> None:
        """What release does, without the pool's lock: at exit a pool may be starting under it. The driver
        stops the workers and the cluster itself; one that does not within `within_s` (a hang guard) is
        ended with everything it started."""
        global _POOL
        if self.released:
            return
        self.released = True
        if _POOL is self:
            _POOL = None
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
        if self.in_comfy:
            self.in_comfy = False
            stand_in().remove()


def pool_for(plan: core.ParallelPlan) -> Pool:
    """The warm pool of this plan, or a new one (the old pool released first)."""
    global _POOL
    with _LOCK:
        if _POOL is not None and _POOL.plan != plan:
            _POOL.release()
        if _POOL is None:
            _POOL = Pool(plan)
        return _POOL


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


# --- one run ---

def sample_on_workers(experts, schedule, lead_model, positive, negative, latent: dict, seed: int, cfg: dict):
    """The run on the plan's workers: rank 0's LATENT, and its record with each rank's figures. The MODELs
    (the experts', the lead's) go as what each worker loads again (model_spec)."""
    plan = experts.parallel_plan
    core.check_sequence(core.latent_tokens(latent["samples"].shape), plan.ulysses_degree)
    for name, conditioning in (("positive", positive), ("negative", negative)):
        carried = sorted({key for _, entry in conditioning for key in WORKERLESS_CONDITIONING if entry.get(key)})
        if carried:
            raise Wan22InputError(name, f"carries {', '.join(carried)} (a ControlNet, hooks or GLIGEN node), which "
                                        "the workers cannot run: remove that node, or run without the parallel plan")
    specs = {role: model_spec(model, role) for role, model in experts.models().items()}
    stage_cfg = {**cfg, **({"lead": schedule.lead.cfg} if schedule.lead is not None else {})}
    job = {"experts": experts.replace(high=None, low=None, parallel_plan=None), "specs": specs,
           "lead": model_spec(lead_model, "lead") if lead_model is not None else None, "schedule": schedule,
           "splits": {stage: plan.stage_split(value) for stage, value in stage_cfg.items()},
           "positive": positive, "negative": negative, "latent": latent, "seed": int(seed), "cfg": dict(cfg)}
    ranks = pool_for(plan).run(job)
    record = ranks[0]["record"]
    record.parallel = core.parallel_report(plan, ranks)
    return ranks[0]["latent"], record
