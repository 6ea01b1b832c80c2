"""Tiny stand-ins for every file the shipped workflows name, under the names ComfyUI's repackaged
Wan2.2 files have. Experts, VAE and the diffusers text encoder are real formats at a tiny size; the
umt5-xxl text encoder cannot be tiny (ComfyUI builds it from a fixed 5.7B-parameter config), so by
default its stand-in is a deliberately unreadable file: it satisfies the prompt validation of the
native CLIP Loader and fails at once if a run reaches it. Runs that need the text encoder ask for the
full-size stand-in of umt5_standin.py instead."""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from PIL import Image

from . import tiny_wan
from .paths import COMFYUI_DIR

EXPERT_FILES = {
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": ("t2v", "high", "fp8_scaled"),
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": ("t2v", "low", "fp8_scaled"),
    "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors": ("i2v", "high", "fp8_scaled"),
    "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors": ("i2v", "low", "fp8_scaled"),
    "wan2.2_t2v_high_noise_14B_fp16.safetensors": ("t2v", "high", "fp16"),
    "wan2.2_t2v_low_noise_14B_fp16.safetensors": ("t2v", "low", "fp16"),
}
# Experts with two attention heads (width 256), which a Ulysses degree of 2 can split: the parallel workflow's
# test runs on them in place of the template's files (the one-head stand-ins above cannot be split).
TWO_HEAD_FILES = {"high": "wan2.2_t2v_high_noise_14B_2heads_fp16.safetensors",
                  "low": "wan2.2_t2v_low_noise_14B_2heads_fp16.safetensors"}
# VACE-Fun A14B's experts (ComfyUI's repackaged names), tiny VACE variants of the text-to-video stand-ins
VACE_FILES = {"high": "wan2.2_fun_vace_high_noise_14B_bf16.safetensors",
              "low": "wan2.2_fun_vace_low_noise_14B_bf16.safetensors"}
TI2V_FILE = "wan2.2_ti2v_5B_fp16.safetensors"  # TI2V-5B, one transformer: a tiny 48-channel stand-in
UMT5 = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
VAE = "wan_2.1_vae.safetensors"
VAE22 = "wan2.2_vae.safetensors"  # TI2V-5B's VAE: full size only (vae22_standin.py)
TEXT_FOLDER = "Wan2.2-T2V-A14B-tiny-Diffusers"
START_IMAGE = "wan22_example_start.png"
CONTROL_IMAGE = "wan22_example_control.png"


def comfyui_on_the_cpu() -> None:
    """ComfyUI importable, on the CPU: the VAE writers build ComfyUI's own VAE classes."""
    if COMFYUI_DIR not in sys.path:
        sys.path.append(COMFYUI_DIR)
    if "comfy.model_management" not in sys.modules:
        from comfy.cli_args import args
        args.cpu = True


def write_standins(models_dir: str, input_dir: str | None = None, working_umt5: bool = False,
                   working_vae22: bool = False) -> None:
    """Writes what is missing (a second call with everything present writes nothing). `working_umt5`:
    a full-size umt5-xxl stand-in that ComfyUI's text encoder really runs (6.7 GB, see umt5_standin.py)
    instead of the unreadable placeholder; `working_vae22`: likewise the Wan2.2 VAE (1.4 GB, see
    vae22_standin.py)."""
    experts = {}
    for name, (task, role, fmt) in EXPERT_FILES.items():
        path = os.path.join(models_dir, "diffusion_models", name)
        if not os.path.isfile(path):
            key = (task, role)
            if key not in experts:
                experts[key] = tiny_wan.make_expert(task, tiny_wan.EXPERT_SEEDS[key])
            tiny_wan.write_single_file(experts[key], path, fmt)
    for role, name in TWO_HEAD_FILES.items():
        path = os.path.join(models_dir, "diffusion_models", name)
        if not os.path.isfile(path):
            expert = tiny_wan.make_expert("t2v", tiny_wan.EXPERT_SEEDS[("t2v", role)], dim=256, ffn_dim=512)
            tiny_wan.write_single_file(expert, path, "fp16")
    for role, name in VACE_FILES.items():
        path = os.path.join(models_dir, "diffusion_models", name)
        if not os.path.isfile(path):
            expert = tiny_wan.make_expert("t2v", tiny_wan.EXPERT_SEEDS[("t2v", role)])
            tiny_wan.write_variant(expert, path, "vace", torch.bfloat16)
    ti2v = os.path.join(models_dir, "diffusion_models", TI2V_FILE)
    if not os.path.isfile(ti2v):
        tiny_wan.write_single_file(tiny_wan.make_expert("ti2v", 9), ti2v, "fp16")
    lora_model = None
    for role, name in tiny_wan.LORA_NAMES.items():  # the LightX2V 4-step LoRAs of ComfyUI's own template
        path = os.path.join(models_dir, "loras", name)
        if not os.path.isfile(path):
            lora_model = lora_model or tiny_wan.make_expert("t2v", 0)
            tiny_wan.write_tiny_lora(lora_model, path, "comfy", seed={"high": 71, "low": 72}[role])
    umt5 = os.path.join(models_dir, "text_encoders", UMT5)
    missing_or_placeholder = not os.path.isfile(umt5) or os.path.getsize(umt5) < 2**30
    if working_umt5 and missing_or_placeholder:
        from .umt5_standin import write_umt5_standin

        write_umt5_standin(umt5)
    elif not os.path.isfile(umt5):
        os.makedirs(os.path.dirname(umt5), exist_ok=True)
        with open(umt5, "wb") as f:
            f.write(b"stand-in: ComfyUI's umt5-xxl has a fixed 5.7B-parameter config and cannot be tiny\n")
    vae = os.path.join(models_dir, "vae", VAE)
    if not os.path.isfile(vae):
        comfyui_on_the_cpu()
        tiny_wan.write_tiny_wan_vae(vae)
    vae22 = os.path.join(models_dir, "vae", VAE22)
    if working_vae22 and (not os.path.isfile(vae22) or os.path.getsize(vae22) < 2**30):
        from .vae22_standin import write_wan22_vae_standin

        comfyui_on_the_cpu()
        write_wan22_vae_standin(vae22)
    elif not os.path.isfile(vae22):
        with open(vae22, "wb") as f:
            f.write(b"stand-in: ComfyUI builds the Wan2.2 VAE at full size; see devtools/vae22_standin.py\n")
    folder = os.path.join(models_dir, "diffusers", TEXT_FOLDER)
    if not os.path.isdir(os.path.join(folder, "text_encoder")):
        tiny_wan.write_diffusers_folder(folder, None, None, boundary_ratio=0.875)
        tiny_wan.write_tiny_text_encoder(folder)
    if input_dir is not None:
        image = os.path.join(input_dir, START_IMAGE)
        if not os.path.isfile(image):
            os.makedirs(input_dir, exist_ok=True)
            y, x = np.mgrid[0:480, 0:832]
            rgb = np.stack([x * 255 // 831, y * 255 // 479, (x + y) * 255 // 1310], axis=-1).astype(np.uint8)
            Image.fromarray(rgb).save(image)
        control = os.path.join(input_dir, CONTROL_IMAGE)
        if not os.path.isfile(control):  # a white figure on black, as a pose or track control frame looks
            y, x = np.mgrid[0:480, 0:832]
            figure = ((x - 416) ** 2 / 60 ** 2 + (y - 240) ** 2 / 160 ** 2) < 1
            Image.fromarray((np.repeat(figure[..., None], 3, axis=-1) * 255).astype(np.uint8)).save(control)
