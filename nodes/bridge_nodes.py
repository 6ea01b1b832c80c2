"""Wan2.2 Experts from MODEL: the experts handle over native MODELs, so that every loader, LoRA and model
patch of ComfyUI works with the pack's nodes."""

from __future__ import annotations

from comfy_api.latest import io

from . import expert_models
from .core.experts import EXPERT_INPUTS
from .core.prompt_graph import upstream_file
from .types import CATEGORY, ExpertsType, linked_only


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
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def validate_inputs(cls, high_noise_model=None, low_noise_model=None):
        return linked_only(high_noise_model=high_noise_model, low_noise_model=low_noise_model)

    @classmethod
    def execute(cls, high_noise_model=None, low_noise_model=None) -> io.NodeOutput:
        # The report names the file behind each MODEL as the prompt shows it (through LoRA loaders and model
        # patches back to the loader); "MODEL" when the prompt does not say.
        hidden = getattr(cls, "hidden", None)
        prompt, node_id = (hidden.prompt or {}, hidden.unique_id) if hidden is not None else ({}, None)
        sources = {role: upstream_file(prompt, node_id, name) for role, name in EXPERT_INPUTS.items()}
        experts = expert_models.experts_handle({"high": high_noise_model, "low": low_noise_model}, sources=sources,
                                               empty="unconnected", fix="connect the MODEL of at least one expert")
        return io.NodeOutput(experts, ui={"text": [experts.summary()]})
