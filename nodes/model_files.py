"""Files chosen from ComfyUI's model folders: expert files, diffusers folders and LoRAs, each resolved inside
its folder (a name can never climb out of it) and checked from its header before anything loads."""

from __future__ import annotations

import os

import folder_paths

from .core import checkpoint
from .core.architecture import check_matching
from .core.errors import Wan22InputError
from .core.experts import EXPERT_INPUTS, NONE


def model_file_path(folder: str, input_name: str, name: str) -> str | None:
    """A file chosen from one of ComfyUI's model folders (`none`: no file), resolved inside that folder."""
    if name == NONE:
        return None
    if not isinstance(name, str):
        raise Wan22InputError(input_name, f"{name!r} is not a file name: pick a file of models/{folder}")
    path = folder_paths.get_full_path(folder, name)
    if path is None:
        raise Wan22InputError(input_name, f"{name!r} is not in models/{folder}: put the file there "
                                          "(then refresh the page) or pick another one")
    return path


def expert_path(role: str, name: str) -> str | None:
    return model_file_path("diffusion_models", EXPERT_INPUTS[role], name)


def inspect_files(names: dict[str, str]) -> dict:
    """Header-only checks of the chosen expert files (role -> file name), and that they match one another."""
    paths = {role: expert_path(role, name) for role, name in names.items()}
    architectures = {role: checkpoint.expert_architecture(path, EXPERT_INPUTS[role])
                     for role, path in paths.items() if path}
    check_matching(architectures, {role: names[role] for role in architectures})
    return architectures


def diffusers_folder_list() -> list[str]:
    """Folders under models/diffusers that hold a model_index.json (as ComfyUI's DiffusersLoader finds them)."""
    found = []
    for base in folder_paths.get_folder_paths("diffusers"):
        if not os.path.isdir(base):
            continue
        for root, dirs, files in os.walk(base, followlinks=True):
            if "model_index.json" in files:
                found.append(os.path.relpath(root, base))
                dirs.clear()
    return sorted(found)


def diffusers_folder_path(name: str) -> str:
    """A listed folder, resolved as ComfyUI's folder_paths resolves files: the name cannot climb out of the
    models folder, and a folder linked in from elsewhere (another drive) loads."""
    if name is not None and not isinstance(name, str):
        raise Wan22InputError("model_folder", f"{name!r} is not a folder name: pick a folder of models/diffusers")
    relative = os.path.relpath(os.path.join("/", name or ""), "/")
    for base in folder_paths.get_folder_paths("diffusers"):
        path = os.path.join(base, relative)
        if relative != "." and os.path.isdir(path):
            return path
    raise Wan22InputError("model_folder", f"{name!r} is not a folder under models/diffusers: put the diffusers "
                                          "Wan2.2 folder there (then refresh the page) or pick another one")
