"""The workers of a parallel plan, from ComfyUI's side: Ray actors (parallel_actor), one per device, in one
torch.distributed group, started for a plan and kept warm (their experts loaded) while runs use the same plan.

They are released when a run uses another plan or none, when ComfyUI frees memory or unloads its models (they
stand in ComfyUI's model management as one tiny model, whose unloading releases them), when a worker fails,
and when ComfyUI exits. A local Ray cluster is started with only what the plan needs, and stopped with the
workers; with RAY_ADDRESS set, the workers join that cluster instead (several machines), which stays up.

What crosses to the workers is small: each expert's loader factory (ComfyUI's `cached_patcher_init`: the
file and its options), the run's weight patches (LoRAs), the schedule, the conditioning and the latent. The
experts' weights never do: each worker loads them itself.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import uuid

import comfy.model_management
import comfy.patcher_extension
import comfy.utils

from . import parallel_actor
from .core import parallel as core
from .core.errors import Wan22InputError
from .core.experts import ROLE_WORDS

POLL_S = 0.2  # how often a run looks at its workers (progress, interrupt, a worker gone)
BOOT_TIMEOUT_S = 600  # a hang guard only: each worker imports torch and ComfyUI first
GRACE_S = 10  # how long the other workers may take to answer once one has failed
# Object patches ComfyUI's own nodes put on a Wan MODEL that the workers rebuild: the flow shift
# (ModelSamplingSD3), which every stage sets again from the schedule.
REBUILT_OBJECT_PATCHES = ("model_sampling",)
# The transformer option the workers take along: an attention override (sage, flash, a Model Attention Backend
# node), sent to them by value and run by the sequence split as its inner attention.
ATTENTION_OVERRIDE = "optimized_attention_override"
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


# --- what the workers rebuild each expert from ---

def unrebuildable(model) -> list[str]:
    """What a MODEL carries beyond its file and its weight patches: Python objects (wrappers, callbacks, model
    and attention patches) that a worker process cannot rebuild, each named for the user."""
    found = [f"object patch {key}" for key in model.object_patches if key not in REBUILT_OBJECT_PATCHES]
    options = model.model_options
    found += [f"model option {key}" for key, value in options.items() if key != "transformer_options" and value]
    found += [f"transformer option {key}" for key, value in options.get("transformer_options", {}).items()
              if value and key != ATTENTION_OVERRIDE]
    for kind, by_key in model.wrappers.items():
        found += [f"{kind} wrapper {key}" for key, wrappers in by_key.items() if wrappers]
    for kind, by_key in model.callbacks.items():
        found += [f"{kind} callback {key}" for key, callbacks in by_key.items() if callbacks]
    found += [f"weight wrapper {key}" for key in model.weight_wrapper_patches]
    found += [f"additional model {key}" for key in model.additional_models]
    found += [f"injection {key}" for key, injections in model.injections.items() if injections]
    found += [f"hook patch {key}" for key in (model.hook_patches or {})]
    found += [f"weight patch with a function on {key}" for key, patches in model.patches.items()
              if any(len(p) > 4 and p[4] is not None for p in patches)]
    return found


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
            "patches_uuid": model.patches_uuid, "attention": attention_override(model, what)}


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
    return Wan22InputError("workers", f"{why}: anyone who can reach the cluster's ports could run code as this "
                                      "user. Leave RAY_AUTH_MODE unset or set it to token (Ray >= 2.60; a cluster "
                                      "you join must be started with it too), or set "
                                      f"{WITHOUT_AUTH}=1 to run without it on a network you trust")


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


def check_authenticated(ray, store) -> None:
    """Once connected: this process and the cluster's workers run with token authentication."""
    if os.environ.get(WITHOUT_AUTH) == "1":
        return
    from ray._raylet import AuthenticationMode, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise authentication_refusal("this process connected to Ray without token authentication")
    if ray.get(store.authentication.remote(), timeout=BOOT_TIMEOUT_S) != "token":
        raise authentication_refusal("the Ray cluster runs its workers without token authentication")


def private_token() -> None:
    """Ray writes its token to ~/.ray/auth_token readable by everyone: only its owner may read it."""
    path = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    except OSError:
        pass


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
    def __init__(self, plan: core.ParallelPlan):
        global _STARTING
        ray = ray_module()
        self.plan, self.ray = plan, ray
        self.connected = False  # whether this pool connected this process to Ray (it disconnects it again)
        self.temp_dir = None  # a local cluster's own folder (its session, sockets and logs), removed on release
        self.actors, self.pids, self.store = [], [], None
        self.released = False
        self.in_comfy = False  # whether the stand-in is loaded in ComfyUI for this pool
        cpu = plan.backend == "gloo"
        needs = {"num_cpus": plan.cpu_threads if cpu else 1,
                 "num_gpus": 0 if cpu else sum(d == "cuda" for d in plan.devices)}
        address = os.environ.get("RAY_ADDRESS")
        check_authentication(ray, cluster=bool(address))
        _STARTING = self
        try:
            if not ray.is_initialized():
                if address:  # join that cluster: releasing the workers disconnects and leaves it up
                    ray.init(address=address, include_dashboard=False, log_to_driver=False,
                             logging_level=logging.WARNING)
                else:  # a new local cluster with only what the plan needs, in a folder of its own
                    self.temp_dir = tempfile.mkdtemp(prefix="wan22-ray-")
                    ray.init(address="local", num_cpus=needs["num_cpus"] * plan.workers + 1,
                             num_gpus=needs["num_gpus"], include_dashboard=False, log_to_driver=False,
                             logging_level=logging.WARNING, _temp_dir=self.temp_dir)
                self.connected = True
                private_token()
            ray.cloudpickle.register_pickle_by_value(sys.modules[parallel_actor.__name__])
            self.alive()
            self.store = ray.remote(parallel_actor.Rendezvous).options(num_cpus=0).remote()
            check_authenticated(ray, self.store)
            actor = ray.remote(parallel_actor.ParallelActor)
            for rank, device in enumerate(plan.devices):
                gpus = 1 if device == "cuda" else 0
                self.alive()
                self.actors.append(actor.options(num_cpus=needs["num_cpus"], num_gpus=gpus, max_concurrency=4)
                                   .remote(rank, plan.workers, physical(device), plan.cpu_threads, comfy_root()))
            pack_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            pack_name = __name__.rsplit(".nodes.", 1)[0]
            loopback = None if address else loopback_interface()
            self.pids = self.wait([a.boot.remote(pack_dir, pack_name, comfy_args(), self.store, loopback)
                                   for a in self.actors], deadline=time.monotonic() + BOOT_TIMEOUT_S)
            stand_in().load()
            self.in_comfy = True
        except BaseException:
            self.release()
            raise
        finally:
            _STARTING = None

    def cluster_processes(self) -> list:
        """The processes of the local cluster this pool started: this process's children that work in its
        folder (GCS, raylet, ...) and everything they started (agents, workers). Ray's agents outlive its
        shutdown by about a minute otherwise."""
        if self.temp_dir is None:
            return []
        import psutil

        found = {}
        for child in psutil.Process().children():
            try:
                if self.temp_dir in " ".join(child.cmdline()):
                    found.update({p.pid: p for p in (child, *child.children(recursive=True))})
            except psutil.Error:
                pass
        return list(found.values())

    def alive(self) -> None:
        """Raises once the pool was stopped (ComfyUI exiting): a Ray call after that would start a new cluster
        (Ray connects by itself when it is not)."""
        if self.released:
            raise RuntimeError("the workers were released (ComfyUI is exiting)")

    def describe(self, rank: int) -> str:
        return f"worker {rank} ({self.plan.devices[rank]})"

    def wait(self, refs, deadline=None, on_poll=None) -> list:
        """Every worker's answer, in rank order. A worker that fails or is gone fails the wait at once, naming
        it (`failed`)."""
        ray = self.ray
        pending = list(refs)
        while pending:
            self.alive()
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                try:
                    ray.get(ref)
                except BaseException as e:
                    raise self.failed(refs, ref, e) from None
            if deadline is not None and time.monotonic() > deadline and pending:
                ranks = [refs.index(r) for r in pending]
                self.release()
                raise RuntimeError(f"{', '.join(self.describe(r) for r in ranks)} did not answer in "
                                   f"{BOOT_TIMEOUT_S} s; the workers were released")
            if on_poll is not None and pending:
                on_poll()
        return ray.get(list(refs))

    def failed(self, refs, first, error: BaseException) -> BaseException:
        """The error of a run one worker failed. The others are given a moment to answer: a worker gone (killed,
        out of memory) is named with its device, and the rest released; a refusal or an interrupt that every
        worker made at the same call leaves them usable; anything else releases them (the others may be
        waiting in a collective for the one that failed)."""
        if self.released:  # stopped meanwhile (ComfyUI exiting): no Ray call may follow
            return RuntimeError(f"the workers were released during the run ({error})")
        ray = self.ray
        others = [r for r in refs if r is not first]
        _, late = ray.wait(others, num_returns=len(others), timeout=GRACE_S)
        errors = {refs.index(first): error}
        for ref in others:
            if ref not in late:
                try:
                    ray.get(ref, timeout=0)
                except BaseException as e:
                    errors[refs.index(ref)] = e
        gone = [(rank, e) for rank, e in sorted(errors.items()) if isinstance(e, ray.exceptions.RayActorError)]
        if gone:
            self.release()
            rank, e = gone[0]
            return Wan22InputError("workers", f"{self.describe(rank)} stopped mid-run ({type(e).__name__}); the "
                                              "workers were released, and the next run starts fresh ones")
        cause = getattr(error, "cause", None) if isinstance(error, ray.exceptions.RayTaskError) else None
        # only a refusal or a cancel that every rank made at the same call leaves the group in a known state
        safe = (Wan22InputError, comfy.model_management.InterruptProcessingException)
        same = len(errors) == len(refs) and all(type(getattr(e, "cause", None)) is type(cause)
                                                for e in errors.values())
        if not (isinstance(cause, safe) and same):
            self.release()
        if cause is not None:
            return cause
        return RuntimeError(f"{self.describe(refs.index(first))} failed: {error}; the workers were released")

    def run(self, job: dict) -> list[dict]:
        ray = self.ray
        job = {**job, "run": uuid.uuid4().hex}  # a cancel names its run: one that comes late cancels no other
        refs = []
        state = {"bar": None, "seen": None, "interrupted": False}

        def interrupt():
            if not state["interrupted"]:
                state["interrupted"] = True
                for a in self.actors:
                    a.interrupt.remote(job["run"])

        def on_poll():
            if self.released:
                return
            if comfy.model_management.processing_interrupted():
                interrupt()
            try:
                progress = ray.get(self.actors[0].progress.remote(), timeout=5)
            except Exception:
                return  # a worker gone: the wait names it
            if progress is not None and progress != state["seen"]:
                bar, value, total = progress
                if state["bar"] is None or state["bar"][0] != bar:
                    state["bar"] = (bar, comfy.utils.ProgressBar(total))
                state["seen"] = progress
                try:
                    state["bar"][1].update_absolute(value, total)
                except comfy.model_management.InterruptProcessingException:
                    interrupt()  # ComfyUI's server hook raises it for a cancel: the workers stop together
        try:
            self.alive()
            job_ref = ray.put(job)
            refs += [a.run.remote(job_ref) for a in self.actors]
            answers = self.wait(refs, on_poll=on_poll)
            if state["interrupted"]:  # cancelled after the workers' last agreement: still a cancel
                raise comfy.model_management.InterruptProcessingException()
            return answers
        except comfy.model_management.InterruptProcessingException:
            comfy.model_management.interrupt_current_processing(False)  # taken, as ComfyUI's own check does
            raise
        except BaseException:
            if not self.released and (not refs or not all(ray.wait([r], timeout=0)[0] for r in refs)):
                self.release()  # never leave a run going behind the next one
            raise

    def release(self) -> None:
        """Stops the workers (and the local cluster this pool started); safe to call more than once."""
        with _LOCK:
            self.stop()

    def stop(self) -> None:
        """What release does, without the pool's lock: at exit a pool may be starting under it."""
        global _POOL
        if self.released:
            return
        self.released = True
        if _POOL is self:
            _POOL = None
        for a in [*self.actors, *([self.store] if self.store is not None else [])]:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:
                pass
        cluster = self.cluster_processes()
        if self.connected:
            self.ray.shutdown()  # stops the local cluster this pool started; only disconnects from a joined one
        stop_processes(cluster)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self.in_comfy:
            self.in_comfy = False
            stand_in().remove()


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


def worker_pids() -> list[int]:
    """The process ids of the warm workers (none when released)."""
    with _LOCK:
        return list(_POOL.pids) if _POOL is not None else []


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

def sample(experts, schedule, positive, negative, latent: dict, seed: int, cfg: dict):
    """The run on the plan's workers: rank 0's LATENT, and its record with each rank's figures."""
    plan = experts.parallel_plan
    core.check_sequence(core.latent_tokens(latent["samples"].shape), plan.ulysses_degree)
    for name, conditioning in (("positive", positive), ("negative", negative)):
        carried = sorted({key for _, entry in conditioning for key in WORKERLESS_CONDITIONING if entry.get(key)})
        if carried:
            raise Wan22InputError(name, f"carries {', '.join(carried)} (a ControlNet, hooks or GLIGEN node), which "
                                        "the workers cannot run: remove that node, or run without the parallel plan")
    specs = {role: model_spec(model, role) for role, model in experts.models().items()}
    lead = schedule.lead
    job = {"experts": experts.replace(high=None, low=None, parallel_plan=None), "specs": specs,
           "lead": model_spec(lead.model, "lead") if lead is not None else None,
           "schedule": schedule.with_lead(dataclasses.replace(lead, model=None)) if lead is not None else schedule,
           "positive": positive, "negative": negative, "latent": latent, "seed": int(seed), "cfg": dict(cfg)}
    ranks = pool_for(plan).run(job)
    record = ranks[0]["record"]
    record.parallel = core.parallel_report(plan, ranks)
    return ranks[0]["latent"], record
