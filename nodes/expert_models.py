"""The experts handle over ComfyUI MODELs: each MODEL checked to be a Wan2.2 A14B expert (refused by input
name when it is not), the two checked to match."""

from __future__ import annotations

import comfy.ldm.wan.model
import comfy.model_base

from .core import experts as core_experts
from .core.architecture import ExpertArchitecture, between_blocks, check_matching, check_task, not_an_expert
from .core.errors import Wan22InputError

UNKNOWN_SOURCE = "MODEL"  # what the report names when nothing says which file a MODEL came from


def architecture_of(model, input_name: str) -> ExpertArchitecture:
    """The architecture of a MODEL, refused by input name when it is not a Wan2.2 A14B expert."""
    what = f"the MODEL given to {input_name}"
    base = getattr(model, "model", None)
    if not isinstance(base, comfy.model_base.WAN21) or not isinstance(getattr(base, "diffusion_model", None),
                                                                      comfy.ldm.wan.model.WanModel):
        kind = type(base).__name__ if base is not None else type(model).__name__
        raise Wan22InputError(input_name, f"{what} is not a Wan 2.x transformer (it is a {kind} model): connect "
                                          "the high-noise or low-noise expert of Wan2.2 A14B, e.g. from Load "
                                          "Diffusion Model")
    config = base.model_config.unet_config
    # camera_2.2: Wan2.2 Fun-Camera (CameraWanModel, its adapter before the plain block loop); vace: VACE-Fun
    # (VaceWanModel, its hints after given blocks: vace_hints.py keeps them when cached)
    if config.get("model_type") not in ("t2v", "i2v", "camera_2.2", "vace"):
        why = between_blocks(model_type=config.get("model_type"))
        raise not_an_expert(input_name, what, f"it is a Wan {config.get('model_type')} model"
                                              + (f"; and Cache-DiT could not cache it: {why}" if why else ""))
    check_task(config["in_dim"], input_name, what)
    text = base.diffusion_model.text_embedding[0]
    return ExpertArchitecture(dim=config["dim"], num_layers=config["num_layers"], in_channels=config["in_dim"],
                              out_channels=config["out_dim"], ffn_dim=config["ffn_dim"],
                              text_dim=getattr(text, "in_features", None) or config.get("text_dim", 4096),
                              camera=config.get("model_type") == "camera_2.2",
                              vace_layers=(config.get("vace_layers") or 0) if config.get("model_type") == "vace" else 0)


def experts_handle(models: dict, sources: dict[str, str] | None = None, declared_boundary: float | None = None,
                   empty: str = "'none'", fix: str = "load at least one expert") -> core_experts.Wan22Experts:
    """The handle over the given MODELs (role -> MODEL or None), each checked, the two checked to match.
    `sources`: what each came from, for the report and the errors (role -> file; "MODEL" when unknown)."""
    core_experts.require_some_expert(models.get("high"), models.get("low"), empty=empty, fix=fix)
    loaded = {role: m for role, m in models.items() if m is not None}
    architectures = {role: architecture_of(m, core_experts.EXPERT_INPUTS[role]) for role, m in loaded.items()}
    sources = {role: (sources or {}).get(role) or UNKNOWN_SOURCE for role in loaded}
    check_matching(architectures, sources)
    architecture = next(iter(architectures.values()))
    return core_experts.Wan22Experts(
        high=models.get("high"), low=models.get("low"), architecture=architecture,
        sources=tuple(sources.get(role, core_experts.NONE) for role in core_experts.ROLES),
        default_boundary=core_experts.default_boundary(architecture, declared_boundary))
