"""The fixed places of a checkout: the pack, its virtual environment, its ComfyUI."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
COMFYUI_DIR = os.path.join(ROOT, ".comfyui", "ComfyUI")
PACK_NAME = "wan22-cachedit"


def make_base_directory(base: str) -> str:
    """A ComfyUI base directory (models, custom_nodes, input, output, user) with this pack linked in."""
    for sub in ("custom_nodes", "models/diffusion_models", "models/diffusers", "input", "output", "temp", "user"):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    link = os.path.join(base, "custom_nodes", PACK_NAME)
    if not os.path.islink(link):
        os.symlink(ROOT, link)
    return base
