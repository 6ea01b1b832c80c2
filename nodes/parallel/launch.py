"""What the Ray driver is told to start a plan's workers with (pool.Pool sends it first): the plan's devices
as a worker must name them, the cores, ComfyUI's folder and options, the pack's folder, and for a pool on one
machine the loopback interface that the workers' transport keeps to."""

from __future__ import annotations

import os


def loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 ('lo' on Linux), for the transport of a pool on one machine."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    return None


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


def driver_config(plan, address: str | None, temp_dir: str | None, comfy_args_bytes: bytes,
                  boot_timeout_s: float) -> dict:
    """The driver's first message (plain values; ComfyUI's options pickled, for the workers): where Ray runs
    (the cluster at `address`, else a local one in `temp_dir`), the devices and cores, and what each worker
    loads (ComfyUI's folder and options, the pack's folder and the name ComfyUI gave it)."""
    cpu = plan.backend == "gloo"
    return {"address": address, "temp_dir": temp_dir, "devices": [physical(d) for d in plan.devices],
            "num_cpus": plan.cpu_threads if cpu else 1,
            "num_gpus": 0 if cpu else sum(d == "cuda" for d in plan.devices),
            "cpu_threads": plan.cpu_threads, "comfy_root": comfy_root(),
            "pack_dir": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "pack_name": __name__.rsplit(".nodes.", 1)[0], "comfy_args": comfy_args_bytes,
            "loopback": None if address else loopback_interface(), "boot_timeout_s": boot_timeout_s}
