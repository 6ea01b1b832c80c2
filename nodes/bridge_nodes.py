"""Wan2.2 Experts from MODEL: the experts handle over native MODELs, so that every loader, LoRA and model
patch of ComfyUI works with the pack's nodes."""

from __future__ import annotations

from comfy_api.latest import io

from . import engine
from .types import CATEGORY, ExpertsType


class Wan22ExpertsFromModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22ExpertsFromModel",
            display_name="Wan2.2 Experts from MODEL",
            category=CATEGORY,
            description="Makes the experts handle from native MODELs: Load Diffusion Model, a GGUF loader, after "
                        "LoRA loaders or model patches. Either may be left unconnected: every step then runs on "
                        "the other. The MODELs are not changed.",
            inputs=[
                io.Model.Input("high_noise_model", optional=True,
                               tooltip="The high-noise expert's MODEL (runs the steps whose sigma is at or above the "
                                       "boundary). Unconnected = low-noise expert only."),
                io.Model.Input("low_noise_model", optional=True,
                               tooltip="The low-noise expert's MODEL (runs the steps below the boundary). "
                                       "Unconnected = high-noise expert only."),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts, for the schedule, LoRA, "
                                                                       "Cache-DiT and sampler nodes.")],
        )

    @classmethod
    def execute(cls, high_noise_model=None, low_noise_model=None) -> io.NodeOutput:
        experts = engine.experts_handle({"high": high_noise_model, "low": low_noise_model}, empty="unconnected",
                                        fix="connect the MODEL of at least one expert")
        return io.NodeOutput(experts, ui={"text": [experts.summary()]})
