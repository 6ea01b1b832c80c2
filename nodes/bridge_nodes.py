"""Wan2.2 Experts from MODEL: the experts handle over native MODELs, so that every loader, LoRA and model
patch of ComfyUI works with the pack's nodes."""

from __future__ import annotations

from comfy_api.latest import io

from . import expert_models
from .core import experts as core_experts
from .core.experts import EXPERT_INPUTS, ExpertsPreview
from .core.prompt_graph import is_link, node_inputs, upstream_file
from .model_files import inspect_files
from .types import CATEGORY, ExpertsType, linked_only

HEADER_FILES = (".safetensors", ".gguf")  # expert files whose header tells the task


def gguf_readable() -> bool:
    """GGUF headers are read with the `gguf` package, which is there wherever ComfyUI-GGUF's loaders run."""
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


class Wan22ExpertsFromModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22ExpertsFromModel",
            display_name="Wan2.2 Experts from MODEL",
            category=CATEGORY,
            description="Makes the experts handle from native MODELs: Load Diffusion Model, a GGUF loader, after "
                        "LoRA loaders or model patches. Either may be left unconnected: every step then runs on "
                        "the other. The MODELs are not changed. The Fun-InP, Fun-Control, Fun-Camera and VACE-Fun "
                        "experts connect the same way; TI2V-5B is one transformer: connect it alone.",
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
    def preview(cls, *, prompt: dict, node_id: str, **_widgets) -> ExpertsPreview:
        """The experts this node of `prompt` will make: which MODEL inputs are connected, and the boundary of
        the first file behind them whose header can be read (else the text-to-video one, assumed)."""
        inputs = node_inputs(prompt, node_id)
        connected = {role: is_link(inputs.get(name)) for role, name in EXPERT_INPUTS.items()}
        core_experts.require_some_expert(*(True if connected[r] else None for r in core_experts.ROLES),
                                         empty="unconnected", fix="connect the MODEL of at least one expert")
        for role, name in EXPERT_INPUTS.items():
            file = upstream_file(prompt, node_id, name) if connected[role] else None
            if file and file.endswith(HEADER_FILES) and (not file.endswith(".gguf") or gguf_readable()):
                architecture = inspect_files({role: file})[role]
                return ExpertsPreview(connected["high"], connected["low"], core_experts.default_boundary(architecture))
        return ExpertsPreview(connected["high"], connected["low"], core_experts.DEFAULT_BOUNDARY["t2v"],
                              boundary_known=False)

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
