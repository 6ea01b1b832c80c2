"""Diffusers Wan2.2 A14B folders (model_index.json, transformer/ = high noise, transformer_2/ = low noise):
the checks before loading, and the key rename that turns a diffusers transformer into ComfyUI's own Wan
layout, so that ComfyUI's loader builds its native model from it.
"""

from __future__ import annotations

import json
import os

from . import checkpoint
from .architecture import ExpertArchitecture, check_matching, check_task
from .errors import Wan22InputError

SUBFOLDERS = {"high": "transformer", "low": "transformer_2"}
# The loader's `experts` choice -> the roles it loads.
CHOICES = {"both": ("high", "low"), "high_noise_only": ("high",), "low_noise_only": ("low",)}
ONLY = {"high": "high_noise_only", "low": "low_noise_only"}

# diffusers name -> ComfyUI's (the original Wan) name; the inverse of the renames in diffusers'
# `convert_wan_transformer_to_diffusers`, applied in this order. diffusers' norm2 is the original
# cross-attention norm3 (the original norm2 is unused by A14B experts' saved tensors).
_TO_COMFY = (
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
    (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."), (".to_out.0.", ".o."),
    (".ffn.net.0.proj.", ".ffn.0."), (".ffn.net.2.", ".ffn.2."),
    (".norm2.", ".norm3."),
)


def comfy_name(name: str) -> str:
    """One diffusers tensor name in ComfyUI's Wan layout."""
    if name == "scale_shift_table":
        return "head.modulation"
    if name.startswith("proj_out."):
        return "head.head." + name[len("proj_out."):]
    if name.startswith(("blocks.", "vace_blocks.")) and name.endswith(".scale_shift_table"):
        name = name[: -len("scale_shift_table")] + "modulation"
    if name.startswith("vace_blocks."):  # a VACE block's projections: in from the control, out to its hint
        name = name.replace(".proj_in.", ".before_proj.").replace(".proj_out.", ".after_proj.")
    for diffusers, comfy in _TO_COMFY:
        name = name.replace(diffusers, comfy)
    return name


def to_comfy_layout(state_dict: dict) -> dict:
    return {comfy_name(k): v for k, v in state_dict.items()}


def weight_files(transformer_dir: str) -> list[str]:
    index = os.path.join(transformer_dir, "diffusion_pytorch_model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            return sorted({os.path.join(transformer_dir, v) for v in json.load(f)["weight_map"].values()})
    return [os.path.join(transformer_dir, "diffusion_pytorch_model.safetensors")]


def architecture_from_config(config: dict, what: str) -> ExpertArchitecture:
    if config.get("_class_name") != "WanTransformer3DModel":
        raise Wan22InputError("model_folder", f"{what} is not a Wan transformer ({config.get('_class_name')}); "
                                              "pick a Wan2.2 A14B diffusers folder")
    check_task(config.get("in_channels"), "model_folder", what)
    return ExpertArchitecture(dim=config["num_attention_heads"] * config["attention_head_dim"],
                              num_layers=config["num_layers"], in_channels=config["in_channels"],
                              out_channels=config.get("out_channels") or config["in_channels"],
                              ffn_dim=config["ffn_dim"], text_dim=config["text_dim"])


def inspect_folder(folder: str, experts: str) -> tuple[dict[str, ExpertArchitecture], float | None]:
    """Checks a diffusers Wan2.2 folder for the requested experts (headers only); returns their
    architectures by role and the boundary that its model_index.json declares (None when none)."""
    name = os.path.basename(os.path.normpath(folder))
    if not isinstance(experts, str) or experts not in CHOICES:
        raise Wan22InputError("experts", f"unknown choice {experts!r}: use one of {', '.join(CHOICES)}")
    index_path = os.path.join(folder, "model_index.json")
    if not os.path.isfile(index_path):
        raise Wan22InputError("model_folder", f"{name} has no model_index.json: pick a diffusers Wan2.2 folder "
                                              "(with transformer/ and transformer_2/) under models/diffusers")
    try:
        with open(index_path, encoding="utf-8") as f:
            model_index = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise Wan22InputError("model_folder", f"{name}/model_index.json cannot be read ({e})") from None
    architectures = {}
    for role in CHOICES[experts]:
        sub = os.path.join(folder, SUBFOLDERS[role])
        config_path = os.path.join(sub, "config.json")
        if not os.path.isfile(config_path):
            other = ONLY["low" if role == "high" else "high"]
            raise Wan22InputError("experts", f"{name} has no {SUBFOLDERS[role]}/ ({role}-noise expert): choose "
                                             f"experts = {other}, or a folder that has it")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        architectures[role] = architecture_from_config(config, f"{name}/{SUBFOLDERS[role]}")
        for weights in weight_files(sub):
            checkpoint.check_file(weights, "model_folder", "folder")
    check_matching(architectures, {role: f"{name}/{SUBFOLDERS[role]}" for role in architectures}, "model_folder")
    declared = model_index.get("boundary_ratio")
    return architectures, (float(declared) if declared is not None else None)
