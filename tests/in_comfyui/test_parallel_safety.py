"""What the parallel plan exposes and leaves behind, probed as a server operator would: the sockets a warm
pool listens on (no open store, nothing of the pack's beyond loopback, Ray's servers behind its token), Ray's
authentication required by name, the bounds a workflow cannot exceed (refused before any worker starts), and
no worker or Ray process left when ComfyUI is terminated."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

from datetime import timedelta

import psutil
import pytest

from . import prompts as P
from .test_parallel import no_process_left, parallel_module, two_heads, with_plan

pytest.importorskip("ray", reason="the parallel plan's tests need Ray (requirements-dev.txt)")
pytest.importorskip("yunchang", reason="the parallel plan's tests need yunchang (requirements-dev.txt)")

RAY_PROCESS_WORDS = ("ray::", "gcs_server", "raylet", "ray/dashboard", "ray/_private", "runtime_env", "default_worker")


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def listening(processes) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of these processes."""
    found = []
    for process in processes:
        try:
            connections = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(process.pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as a dual-stack socket shows IPv4 loopback
    return (mapped or ip).is_loopback


def is_ray_process(pid: int) -> bool:
    try:
        text = " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return False
    return any(word in text for word in RAY_PROCESS_WORDS)


STORE_PROBE = """
import sys, threading
from datetime import timedelta
import torch.distributed as dist

def probe(port):
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5),
                              wait_for_workers=False)
        store.set("wan22-probe", "x")
        if store.get("wan22-probe") == b"x":
            print("OPEN", port, flush=True)
    except Exception:
        pass

threads = [threading.Thread(target=probe, args=(int(p),), daemon=True) for p in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
"""


def open_stores(ports) -> list[int]:
    """The ports where a torch.distributed store client, over loopback, writes and reads back a key (what any
    process on this machine could do with a TCPStore rendezvous). A client that reaches some other server can
    wait forever for its answer, so the probes run in a process of their own, ended after a while."""
    try:
        done = subprocess.run([sys.executable, "-c", STORE_PROBE, *map(str, ports)], capture_output=True,
                              text=True, timeout=120)
        output = done.stdout
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return sorted(int(line.split()[1]) for line in output.splitlines() if line.startswith("OPEN "))


def test_the_store_probe_finds_a_tcp_store_and_nothing_else():
    """The probe below can fail: it finds a torch.distributed TCPStore (the kind of rendezvous a pool once
    opened on every interface) and passes over a listener that is not one."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        assert open_stores([port, other.getsockname()[1]]) == [port]
    del store


def driver_processes() -> list[psutil.Process]:
    """The pools' Ray drivers (nodes/parallel/driver.py) this process started."""
    found = []
    for child in psutil.Process().children():
        try:
            if any(arg.endswith(os.path.join("parallel", "driver.py")) for arg in child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.slow  # about 2 minutes: the store probe waits out every listener that is not a store
def test_a_warm_pool_opens_no_store_and_beyond_loopback_only_rays_authenticated_servers_listen(
        comfyui, tiny_models, parallel_experts, tmp_path):
    import ray

    P.run_ok(comfyui, with_plan(two_heads(parallel_experts, tiny_models, cfg=(1.0, 1.0))))
    workers = comfyui.worker_pids()
    assert len(workers) == 2
    drivers = [p.pid for p in driver_processes()]
    assert len(drivers) == 1 and not ray.is_initialized(), "Ray's driver runs in a process of its own, not ComfyUI's"
    token = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")  # Ray's, for the cluster it started
    assert os.stat(token).st_mode & 0o077 == 0, "only its owner may read Ray's token"
    sockets = listening(process_tree(os.getpid()))
    assert {pid for pid, _, _ in sockets} >= set(workers), sockets
    stores = open_stores(sorted({port for _, _, port in sockets}))
    assert stores == [], f"a store anyone on this machine can read and write listens on {stores}"
    beyond = [(pid, address, port) for pid, address, port in sockets if not on_loopback(address)]
    # ComfyUI's process listens on nothing beyond loopback; the pack's own sockets (the workers' transport) stay
    # on loopback; beyond it, only Ray's servers: its core worker in the driver and in each worker (one each),
    # its GCS, raylet and agents
    assert [s for s in beyond if s[0] == os.getpid()] == [], beyond
    for pid in [*drivers, *workers]:
        own = [s for s in beyond if s[0] == pid]
        assert len(own) <= 1, f"process {pid} listens beyond loopback on {own}: only Ray's core worker may"
    assert all(is_ray_process(pid) for pid, _, _ in beyond if pid not in (*drivers, *workers)), beyond
    # and Ray's servers refuse a client without the token
    gcs = parallel_module(comfyui)._POOL.gcs_address
    home = tmp_path / "home"
    home.mkdir()
    probe = ("import ray; ray.init(address=%r, log_to_driver=False); "
             "print('JOINED', ray.get(ray.remote(lambda: 1).remote(), timeout=20))" % gcs)
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        joined = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        output = joined.stdout + joined.stderr
    except subprocess.TimeoutExpired as e:
        output = f"timed out: {e}"
    assert "JOINED" not in output, output


def refused_before_any_worker(comfyui, prompt) -> str:
    import ray

    message = P.failed_at_run(comfyui, prompt)
    assert comfyui.worker_pids() == [] and driver_processes() == [] and not ray.is_initialized(), \
        "nothing may start"
    return message


@pytest.mark.parametrize("cluster", [False, True], ids=["local", "RAY_ADDRESS"])
def test_ray_without_token_authentication_is_refused_by_name(comfyui, tiny_models, parallel_experts, monkeypatch,
                                                             cluster):
    parallel_module(comfyui).release()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    if cluster:
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # never reached: refused before connecting
    message = refused_before_any_worker(comfyui, with_plan(two_heads(parallel_experts, tiny_models)))
    where = "the Ray cluster at RAY_ADDRESS" if cluster else "the local Ray cluster"
    assert f"workers: RAY_AUTH_MODE=disabled would run {where} without token authentication" in message, message
    assert "WAN22_RAY_WITHOUT_AUTH=1" in message


def test_a_ray_that_predates_token_authentication_is_refused_by_name(comfyui, tiny_models, parallel_experts,
                                                                     monkeypatch):
    import ray._raylet

    parallel_module(comfyui).release()
    monkeypatch.delattr(ray._raylet, "get_authentication_mode")
    message = refused_before_any_worker(comfyui, with_plan(two_heads(parallel_experts, tiny_models)))
    assert f"workers: Ray {ray.__version__} predates token authentication" in message, message


@pytest.mark.parametrize("plan, words", [
    (dict(workers=3, ulysses_degree=3, devices="cpu, cpu, cpu"), "workers: 3 CPU workers but this machine has"),
    (dict(cpu_threads=3), "cpu_threads: 3 threads: use 0 (share the cores) up to this machine's 2 cores"),
    (dict(devices="cuda:999, cuda:998"), "devices: 'cuda:999, cuda:998' names cuda:999, cuda:998, but this "
                                         "process sees 0 GPU(s)"),
    (dict(devices="cuda, cuda"), "devices: 'cuda, cuda' asks for 2 GPUs, but this process sees 0"),
], ids=["cpu-workers", "cpu-threads", "cuda-pinned", "cuda"])
def test_bounds_are_refused_by_name_before_any_worker_starts(comfyui, tiny_models, parallel_experts, monkeypatch,
                                                            plan, words):
    parallel_module(comfyui).release()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # two cores and no GPU, wherever the suite runs
    monkeypatch.setattr(comfyui.pack("nodes.parallel_nodes"), "gpus_here", lambda: 0)
    message = refused_before_any_worker(comfyui, with_plan(two_heads(parallel_experts, tiny_models), **plan))
    assert words in message, message


@pytest.mark.parametrize("signal_name", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow),
                                         pytest.param("SIGKILL", marks=pytest.mark.slow)])
def test_terminating_comfyui_mid_run_stops_every_worker_and_ray(tiny_models_server_factory, tiny_models,
                                                                 parallel_experts, signal_name):
    """A real server, a parallel run under way, then ComfyUI is sent the signal: a few seconds later no
    process it started is left (the driver, workers, GCS, raylet, agents). SIGKILL runs no handler of ComfyUI's:
    the driver sees its pipe close and stops the rest."""
    import signal
    import time

    server = tiny_models_server_factory(f"terminated_{signal_name}")
    prompt = with_plan(two_heads(parallel_experts, tiny_models, sampler="euler", steps=200, cfg=(1.0, 1.0),
                                 width=64, height=64, length=9))
    status, body = server.queue(prompt)
    assert status == 200, body
    deadline = time.monotonic() + 600
    while not [p for p in process_tree(server.process.pid)[1:] if "ParallelActor" in " ".join(p.cmdline())]:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.5)
    time.sleep(5)  # the run under way
    started = [p.pid for p in process_tree(server.process.pid)[1:]]
    server.process.send_signal(getattr(signal, signal_name))
    server.process.wait(timeout=300)  # a hang guard: it ends within seconds
    assert no_process_left(started) == [], [" ".join(psutil.Process(p).cmdline()[:3])
                                                         for p in no_process_left(started, within=0)]


def resources(server) -> dict:
    """What ComfyUI's process holds, what it has started, and the Ray session folders on this machine."""
    import glob
    import tempfile

    process = psutil.Process(server.process.pid)
    temp = tempfile.gettempdir()
    return {"descriptors": process.num_fds(), "threads": process.num_threads(),
            "processes": len(process.children(recursive=True)),
            "session_folders": len(glob.glob(os.path.join(temp, "wan22-ray-*"))
                                   + glob.glob(os.path.join(temp, "ray", "session_2*")))}


def settled(server, within=60.0) -> dict:
    """The resources once the released pool's processes are gone (a hang guard: they go within seconds)."""
    import time

    deadline = time.monotonic() + within
    while True:
        now = resources(server)
        if now["processes"] == 0 or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


@pytest.fixture(scope="module")
def plan_cycles(tiny_models_server_factory, tiny_models, parallel_experts):
    """A real server's resources before and after six plan / no-plan cycles (after two cycles first: the first
    ones import Ray and start the threads it keeps)."""
    server = tiny_models_server_factory("plan_cycles")

    def cycle(seed: int):  # a new seed each time: ComfyUI would serve a repeated prompt from its cache
        prompt = two_heads(parallel_experts, tiny_models, cfg=(1.0, 1.0), seed=seed)
        for graph in (with_plan(prompt), prompt):  # the run without the plan releases the workers
            prompt_id = server.queue(graph)[1]["prompt_id"]
            entry = server.wait(prompt_id)
            assert entry["status"]["status_str"] == "success", entry["status"]
    cycle(0)
    cycle(1)
    before = settled(server)
    for seed in range(2, 8):
        cycle(seed)
    yield before, settled(server)


@pytest.mark.slow
def test_six_plan_and_no_plan_cycles_on_a_real_server_leave_no_process_folder_or_thread(plan_cycles):
    before, after = plan_cycles
    assert after["processes"] == before["processes"] == 0, (before, after)
    assert after["session_folders"] == before["session_folders"], (before, after)
    assert after["threads"] <= before["threads"], (before, after)


@pytest.mark.slow
def test_six_plan_and_no_plan_cycles_on_a_real_server_leave_no_descriptor(plan_cycles):
    """Ray's init/shutdown alone leaves about one descriptor a cycle in the process that connects (its core
    worker's gRPC socket, its log file): the pool's driver is a process of its own, so ComfyUI's stay flat."""
    before, after = plan_cycles
    assert after["descriptors"] <= before["descriptors"] + 2, (before, after)  # not one or more a cycle
