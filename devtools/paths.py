"""The fixed places of a checkout: the pack, its virtual environment, its ComfyUI."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
COMFYUI_DIR = os.path.join(ROOT, ".comfyui", "ComfyUI")
PACK_NAME = "wan22-cachedit"
FRONTENDS_PIN = os.path.join(ROOT, "devtools", "frontends.txt")


def newest_frontend() -> tuple[str, str]:
    """(version, folder ComfyUI serves with --front-end-root) of the newest frontend the tests run on."""
    with open(FRONTENDS_PIN, encoding="utf-8") as f:
        (pin,) = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    version = pin.split("==")[1]
    return version, os.path.join(ROOT, ".frontends", version, "comfyui_frontend_package", "static")


def make_base_directory(base: str) -> str:
    """A ComfyUI base directory (models, custom_nodes, input, output, user) with this pack linked in."""
    for sub in ("custom_nodes", "models/diffusion_models", "models/diffusers", "input", "output", "temp", "user"):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    link = os.path.join(base, "custom_nodes", PACK_NAME)
    if not os.path.islink(link):
        os.symlink(ROOT, link)
    return base


def import_pack(name: str = "wan22_cachedit"):
    """The pack imported as a package of its own name: its `nodes` package must never be a top-level
    module, where it would shadow ComfyUI's `nodes`."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "__init__.py"),
                                                      submodule_search_locations=[ROOT])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
