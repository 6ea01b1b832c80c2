"""Whether a parallel plan can run in this process: Ray and yunchang importable, else the refusal that says
how to install them (imported here, and only here, from ComfyUI's side)."""

from __future__ import annotations

from ..core import parallel as core
from ..core.errors import Wan22InputError


def ray_module():
    """Ray, once yunchang (the sequence split's all-to-all, imported by each worker) is known importable too."""
    try:
        import ray
        import yunchang  # noqa: F401
    except ImportError as e:
        raise Wan22InputError("workers", f"the parallel plan needs Ray and yunchang ({e.name} is not installed): "
                                         f"{core.INSTALL}") from None
    return ray
