"""Load Wan2.2 Experts (ComfyUI single files) and Load Wan2.2 Experts (Diffusers folder): both give native
ComfyUI models, loaded by ComfyUI's own diffusion-model loader."""

from __future__ import annotations

import os

import folder_paths
import torch
from comfy_api.latest import io

import comfy.sd
import comfy.utils

from . import expert_models
from .core import diffusers_folder as folders
from .core.errors import Wan22InputError
from .core.experts import NONE, ROLES, ExpertsPreview, default_boundary, require_some_expert
from .model_files import diffusers_folder_list, diffusers_folder_path, expert_path, inspect_files
from .types import CATEGORY, ExpertsType

# weight_dtype -> ComfyUI's model options. fp32/bf16/fp16 are the pack's own since its first release; default and
# the fp8 ones are ComfyUI's own Load Diffusion Model choices, which its load_unet maps inline (no function to
# call, and the diffusers folders need the same options for their state dicts): a test holds them to it.
WEIGHT_DTYPES = {
    "default": {},
    "fp32": {"dtype": torch.float32},
    "bf16": {"dtype": torch.bfloat16},
    "fp16": {"dtype": torch.float16},
    "fp8_e4m3fn": {"dtype": torch.float8_e4m3fn},
    "fp8_e4m3fn_fast": {"dtype": torch.float8_e4m3fn, "fp8_optimizations": True},
    "fp8_e5m2": {"dtype": torch.float8_e5m2},
}
DTYPE_TOOLTIP = ("The experts' weight dtype, as in Load Diffusion Model. 'default' keeps ComfyUI's choice for the "
                 "file (scaled fp8 files stay fp8); fp32/bf16/fp16 load in that dtype; fp8_e4m3fn(_fast)/fp8_e5m2 "
                 "store the weights in fp8 (_fast also computes in fp8 where the GPU can).")


def model_options(weight_dtype: str) -> dict:
    if weight_dtype not in WEIGHT_DTYPES:
        raise Wan22InputError("weight_dtype", f"unknown dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPES)}")
    return dict(WEIGHT_DTYPES[weight_dtype])


class Wan22ExpertLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = [NONE] + folder_paths.get_filename_list("diffusion_models")
        return io.Schema(
            node_id="Wan22ExpertLoader",
            display_name="Load Wan2.2 Experts",
            category=CATEGORY,
            description="Loads the high-noise and low-noise experts of Wan2.2 A14B from single files with ComfyUI's "
                        "own loader (as Load Diffusion Model does). Either may be 'none': every step then runs on "
                        "the loaded one. The Fun-InP, Fun-Control, Fun-Camera and VACE-Fun experts load the same "
                        "way; TI2V-5B is one transformer: load it in one input.",
            inputs=[
                io.Combo.Input("high_noise_model", options=files, default=NONE,
                               tooltip="High-noise expert (runs the steps whose sigma is at or above the boundary), "
                                       "from models/diffusion_models. 'none' = low-noise expert only."),
                io.Combo.Input("low_noise_model", options=files, default=NONE,
                               tooltip="Low-noise expert (runs the steps below the boundary), from "
                                       "models/diffusion_models. 'none' = high-noise expert only."),
                io.Combo.Input("weight_dtype", options=list(WEIGHT_DTYPES), default="default", tooltip=DTYPE_TOOLTIP,
                               advanced=True),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The loaded experts, for the schedule, "
                                                                       "LoRA, Cache-DiT and sampler nodes.")],
        )

    @classmethod
    def preview(cls, high_noise_model=NONE, low_noise_model=NONE, **_context) -> ExpertsPreview:
        """The experts these inputs load, from the files' headers (the node's validation and the canvas's split)."""
        require_some_expert(high_noise_model, low_noise_model)
        architectures = inspect_files({"high": high_noise_model, "low": low_noise_model})
        return ExpertsPreview(has_high=high_noise_model != NONE, has_low=low_noise_model != NONE,
                              default_boundary=default_boundary(next(iter(architectures.values()))))

    @classmethod
    def validate_inputs(cls, high_noise_model=None, low_noise_model=None):
        # Header-only checks, so a wrong file is refused at queue time, before anything runs. A linked input
        # is None here: its value is known only when the prompt runs, and execute checks it then.
        names = {"high": high_noise_model, "low": low_noise_model}
        try:
            if None not in names.values():
                cls.preview(high_noise_model, low_noise_model)
            else:
                inspect_files({role: name for role, name in names.items() if name is not None})
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, high_noise_model, low_noise_model, weight_dtype="default") -> io.NodeOutput:
        names = {"high": high_noise_model, "low": low_noise_model}
        require_some_expert(high_noise_model, low_noise_model)
        inspect_files(names)
        options = model_options(weight_dtype)
        progress = comfy.utils.ProgressBar(sum(name != NONE for name in names.values()))
        models = {}
        for role in ROLES:
            path = expert_path(role, names[role])
            if path is not None:
                models[role] = comfy.sd.load_diffusion_model(path, model_options=dict(options))
                progress.update(1)
        experts = expert_models.experts_handle(models, sources={r: n for r, n in names.items() if n != NONE})
        return io.NodeOutput(experts, ui={"text": [experts.summary()]})


def load_diffusers_expert(transformer_dir: str, options: dict, disable_dynamic: bool = False):
    """One diffusers transformer as ComfyUI's native Wan model: its keys renamed to ComfyUI's layout, then
    ComfyUI's own state-dict loader (the one behind Load Diffusion Model)."""
    state_dict = {}
    for path in folders.weight_files(transformer_dir):
        state_dict.update(comfy.utils.load_torch_file(path, safe_load=True))
    model = comfy.sd.load_diffusion_model_state_dict(folders.to_comfy_layout(state_dict), model_options=dict(options),
                                                     disable_dynamic=disable_dynamic)
    if model is None:
        raise Wan22InputError("model_folder", f"ComfyUI cannot read {transformer_dir} as a Wan model; pick a "
                                              "Wan2.2 A14B diffusers folder")
    model.cached_patcher_init = (load_diffusers_expert, (transformer_dir, options))
    return model


class Wan22DiffusersExpertLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22DiffusersExpertLoader",
            display_name="Load Wan2.2 Experts (Diffusers)",
            category=CATEGORY,
            description="Loads Wan2.2 A14B experts from a diffusers folder (transformer/ = high noise, "
                        "transformer_2/ = low noise) as ComfyUI's native model. Its model_index.json "
                        "boundary_ratio becomes the default boundary.",
            inputs=[
                io.Combo.Input("model_folder", options=diffusers_folder_list(),
                               tooltip="A diffusers Wan2.2 A14B folder under models/diffusers."),
                io.Combo.Input("experts", options=list(folders.CHOICES), default="both",
                               tooltip="Which experts to load: both, or one alone (every step then runs on it)."),
                io.Combo.Input("weight_dtype", options=list(WEIGHT_DTYPES), default="default", tooltip=DTYPE_TOOLTIP,
                               advanced=True),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The loaded experts.")],
        )

    @classmethod
    def preview(cls, model_folder="", experts="both", **_context) -> ExpertsPreview:
        """The experts these inputs load, from the folder's headers and model_index.json (the node's validation
        and the canvas's split)."""
        architectures, declared = folders.inspect_folder(diffusers_folder_path(model_folder), experts)
        return ExpertsPreview(has_high="high" in architectures, has_low="low" in architectures,
                              default_boundary=default_boundary(next(iter(architectures.values())), declared))

    @classmethod
    def validate_inputs(cls, model_folder=None, experts=None):
        if model_folder is None or experts is None:
            return True
        try:
            cls.preview(model_folder, experts)
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, model_folder, experts, weight_dtype="default") -> io.NodeOutput:
        folder = diffusers_folder_path(model_folder)
        architectures, declared = folders.inspect_folder(folder, experts)
        options = model_options(weight_dtype)
        progress = comfy.utils.ProgressBar(len(architectures))
        models, sources = {}, {}
        for role in architectures:
            models[role] = load_diffusers_expert(os.path.join(folder, folders.SUBFOLDERS[role]), options)
            sources[role] = f"{model_folder}/{folders.SUBFOLDERS[role]}"
            progress.update(1)
        handle = expert_models.experts_handle(models, sources=sources, declared_boundary=declared)
        return io.NodeOutput(handle, ui={"text": [handle.summary()]})
