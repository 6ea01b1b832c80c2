"""Load Wan2.2 Experts (ComfyUI single files) and Load Wan2.2 Experts (Diffusers folder)."""

from __future__ import annotations

import gc
import os

import folder_paths
from comfy_api.latest import io

import comfy.utils

from .core import experts as core
from .core.errors import Wan22InputError
from .types import CATEGORY, ExpertsType

NONE = "none"
DTYPE_TOOLTIP = ("Compute dtype of the experts. 'default' keeps the file's own precision (fp8 files compute in "
                 "bf16 and stay fp8 in memory); fp32 is exact and slowest.")


def collect_dropped_experts() -> None:
    """Experts that ComfyUI has just dropped may still be held by reference cycles (cache-dit binds its
    forward to the module), which only a full collection frees: free them before loading new ones."""
    gc.collect()


def model_file_path(folder: str, input_name: str, name: str) -> str | None:
    """A file chosen from one of ComfyUI's model folders (`none`: no file), resolved inside that folder."""
    if name == NONE:
        return None
    path = folder_paths.get_full_path(folder, name)
    if path is None:
        raise Wan22InputError(input_name, f"{name!r} is not in models/{folder}: put the file there "
                                          "(then refresh the page) or pick another one")
    return path


def expert_path(input_name: str, name: str) -> str | None:
    return model_file_path("diffusion_models", input_name, name)


class Wan22ExpertLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = [NONE] + folder_paths.get_filename_list("diffusion_models")
        return io.Schema(
            node_id="Wan22ExpertLoader",
            display_name="Load Wan2.2 Experts",
            category=CATEGORY,
            description="Loads the high-noise and low-noise experts of Wan2.2 A14B from ComfyUI's single files "
                        "(fp32, fp16, bf16 or scaled fp8). Either may be 'none': every step then runs on the "
                        "loaded one.",
            inputs=[
                io.Combo.Input("high_noise_model", options=files, default=NONE,
                               tooltip="High-noise expert (runs the steps whose timestep is at or above the "
                                       "boundary), from models/diffusion_models. 'none' = low-noise expert only."),
                io.Combo.Input("low_noise_model", options=files, default=NONE,
                               tooltip="Low-noise expert (runs the steps below the boundary), from "
                                       "models/diffusion_models. 'none' = high-noise expert only."),
                io.Combo.Input("weight_dtype", options=list(core.WEIGHT_DTYPES), default="default",
                               tooltip=DTYPE_TOOLTIP),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The loaded experts, for the schedule, "
                                                                       "Cache-DiT and sampler nodes.")],
        )

    @classmethod
    def validate_inputs(cls, high_noise_model, low_noise_model):
        # Header-only checks, so a wrong file is refused at queue time, before anything runs.
        try:
            core.require_some_expert(high_noise_model or NONE, low_noise_model or NONE)
            core.inspect_single_files({
                "high_noise": expert_path("high_noise_model", high_noise_model or NONE),
                "low_noise": expert_path("low_noise_model", low_noise_model or NONE)})
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, high_noise_model, low_noise_model, weight_dtype) -> io.NodeOutput:
        core.require_some_expert(high_noise_model, low_noise_model)
        collect_dropped_experts()
        progress = comfy.utils.ProgressBar(sum(name != NONE for name in (high_noise_model, low_noise_model)))
        experts = core.load_single_file_experts(expert_path("high_noise_model", high_noise_model),
                                                expert_path("low_noise_model", low_noise_model),
                                                weight_dtype, names=(high_noise_model, low_noise_model),
                                                on_loaded=lambda: progress.update(1))
        return io.NodeOutput(experts, ui={"text": [experts.summary()]})


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
    for base in folder_paths.get_folder_paths("diffusers"):
        base = os.path.realpath(base)
        path = os.path.realpath(os.path.join(base, name))
        if os.path.commonpath([base, path]) == base and os.path.isdir(path):
            return path
    raise Wan22InputError("model_folder", f"{name!r} is not a folder under models/diffusers: put the diffusers "
                                          "Wan2.2 folder there (then refresh the page) or pick another one")


class Wan22DiffusersExpertLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22DiffusersExpertLoader",
            display_name="Load Wan2.2 Experts (Diffusers)",
            category=CATEGORY,
            description="Loads Wan2.2 A14B experts from a diffusers folder (transformer/ = high noise, "
                        "transformer_2/ = low noise). Its model_index.json boundary_ratio becomes the default "
                        "boundary.",
            inputs=[
                io.Combo.Input("model_folder", options=diffusers_folder_list(),
                               tooltip="A diffusers Wan2.2 A14B folder under models/diffusers."),
                io.Combo.Input("experts", options=list(core.DIFFUSERS_CHOICES), default="both",
                               tooltip="Which experts to load: both, or one alone (every step then runs on it)."),
                io.Combo.Input("weight_dtype", options=list(core.WEIGHT_DTYPES), default="default",
                               tooltip=DTYPE_TOOLTIP),
            ],
            outputs=[ExpertsType.Output(display_name="experts")],
        )

    @classmethod
    def validate_inputs(cls, model_folder, experts):
        if model_folder is None or experts is None:
            return True
        try:
            core.inspect_diffusers_folder(diffusers_folder_path(model_folder), experts)
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, model_folder, experts, weight_dtype) -> io.NodeOutput:
        collect_dropped_experts()
        progress = comfy.utils.ProgressBar(len(core.DIFFUSERS_CHOICES.get(experts, ())))
        loaded = core.load_diffusers_experts(diffusers_folder_path(model_folder), experts, weight_dtype,
                                             on_loaded=lambda: progress.update(1))
        return io.NodeOutput(loaded, ui={"text": [loaded.summary()]})
