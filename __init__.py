"""Wan2.2 Cache-DiT: Wan2.2 A14B's two experts under Cache-DiT, with the split derived from each run's schedule.

Importing this package outside ComfyUI works: the node modules (which need ComfyUI) load only when
ComfyUI calls `comfy_entrypoint`.
"""

WEB_DIRECTORY = "./web"

__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]


async def comfy_entrypoint():
    from .nodes.extension import Wan22CacheDiTExtension

    return Wan22CacheDiTExtension()
