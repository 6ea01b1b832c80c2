"""Wan2.2 Text Encode (Diffusers): conditioning from a diffusers Wan2.2 folder's own umt5 text encoder.

The encoder is loaded for one encoding and let go right after: the node keeps nothing between runs (ComfyUI
caches its CONDITIONING while its inputs stay the same). While it encodes, it is a model of ComfyUI's model
management, like ComfyUI's own text encoders: loaded onto the text-encoder device by `load_models_gpu`,
which first frees room (offloading the experts if need be). ComfyUI's own umt5 files go through the native
CLIP Loader and CLIP Text Encode instead."""

from __future__ import annotations

import torch
from comfy_api.latest import io

import comfy.model_management as mm
import comfy.model_patcher

from .core import text_encoder
from .model_files import diffusers_folder_list, diffusers_folder_path
from .types import CATEGORY


def encoder_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU, fp32 on the CPU (umt5 overflows in fp16)."""
    return torch.float32 if mm.is_device_cpu(device) else torch.bfloat16


class ManagedEncoder(torch.nn.Module):
    """Holds the transformers encoder for ComfyUI's ModelPatcher, which records the device it moves a model to
    on the model itself (transformers models have a read-only `device`)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder


def managed(model) -> comfy.model_patcher.ModelPatcher:
    """The encoder as a model of ComfyUI's model management, as ComfyUI wraps its own text encoders."""
    return comfy.model_patcher.CoreModelPatcher(ManagedEncoder(model), load_device=mm.text_encoder_device(),
                                                offload_device=mm.text_encoder_offload_device())


class Wan22TextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22TextEncode",
            display_name="Wan2.2 Text Encode (Diffusers)",
            category=CATEGORY,
            description="Encodes a prompt and a negative prompt with the umt5 text encoder of a diffusers "
                        "Wan2.2 folder, as diffusers' WanPipeline does. With ComfyUI's own umt5_xxl file, use the "
                        "native CLIP Loader (type wan) and CLIP Text Encode instead.",
            inputs=[
                io.Combo.Input("model_folder", options=diffusers_folder_list(),
                               tooltip="A diffusers Wan2.2 folder under models/diffusers with text_encoder/ and "
                                       "tokenizer/."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="What the video shows."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="What to steer away from (used when a CFG scale is not 1.0)."),
            ],
            outputs=[
                io.Conditioning.Output(display_name="positive"),
                io.Conditioning.Output(display_name="negative"),
            ],
        )

    @classmethod
    def execute(cls, model_folder, prompt, negative_prompt) -> io.NodeOutput:
        dtype = encoder_dtype(mm.text_encoder_device())
        tokenizer, model = text_encoder.load_text_encoder(diffusers_folder_path(model_folder), dtype)
        patcher = managed(model)
        try:
            mm.load_models_gpu([patcher])
            embeds = text_encoder.encode(tokenizer, model, [prompt, negative_prompt])
        finally:
            del patcher, model
            mm.soft_empty_cache()
        embeds = embeds.to(mm.intermediate_device())
        return io.NodeOutput([[embeds[0:1], {}]], [[embeds[1:2], {}]])
