"""A small route on ComfyUI's server: the split of a schedule, made by the same function the schedule node
uses, so the canvas can show it live as the widgets change."""

from __future__ import annotations

from aiohttp import web
from server import PromptServer

from . import engine
from .core import diffusers_folder as folders
from .core import experts as core_experts
from .core.errors import Wan22InputError
from .loader_nodes import diffusers_folder_path, inspect_files

ROUTE = "/wan22/split"


def bridge_experts(models: dict) -> tuple[bool, bool, float, bool]:
    """For Wan2.2 Experts from MODEL: which MODEL inputs are connected ({} or the upstream file, None when not),
    and the boundary of the first upstream file that can be read; False when it was assumed."""
    connected = {role: models.get(role) is not None for role in core_experts.ROLES}
    core_experts.require_some_expert(*(models.get(role) for role in core_experts.ROLES), empty="unconnected",
                                     fix="connect the MODEL of at least one expert")
    files = {role: (models.get(role) or {}).get("unet_name") for role in core_experts.ROLES}
    for role, name in files.items():
        if name and name.endswith(".safetensors"):
            architecture = inspect_files({role: name})[role]
            return connected["high"], connected["low"], core_experts.default_boundary(architecture), True
    return connected["high"], connected["low"], core_experts.DEFAULT_BOUNDARY["t2v"], False


def loaded_experts(loader: dict) -> tuple[bool, bool, float, bool]:
    """(has_high, has_low, model default boundary, whether that boundary was read off the files) of the
    node that gives the schedule its experts, from its widget values and file headers."""
    kind, values = loader.get("type"), loader.get("values") or {}
    if kind == "Wan22DiffusersExpertLoader":
        architectures, declared = folders.inspect_folder(diffusers_folder_path(values.get("model_folder", "")),
                                                         values.get("experts", "both"))
        default = core_experts.default_boundary(next(iter(architectures.values())), declared)
        return "high" in architectures, "low" in architectures, default, True
    if kind == "Wan22ExpertLoader":
        names = {role: values.get(core_experts.EXPERT_INPUTS[role], core_experts.NONE) for role in core_experts.ROLES}
        core_experts.require_some_expert(names["high"], names["low"])
        architectures = inspect_files(names)
        default = core_experts.default_boundary(next(iter(architectures.values())))
        return names["high"] != core_experts.NONE, names["low"] != core_experts.NONE, default, True
    if kind == "Wan22ExpertsFromModel":
        return bridge_experts(loader.get("models") or {})
    raise Wan22InputError("experts", "connect the experts input to a Wan2.2 expert loader")


@PromptServer.instance.routes.post(ROUTE)
async def split(request: web.Request) -> web.Response:
    try:
        body = await request.json()
        has_high, has_low, default, known = loaded_experts(body.get("loader") or {})
        custom = float(body["boundary_ratio"]) if body.get("boundary") == "custom" else None
        schedule = engine.build_schedule(has_high=has_high, has_low=has_low, model_default=default,
                                         sampler=body.get("sampler"), scheduler=body.get("scheduler", "simple"),
                                         steps=int(body["steps"]), flow_shift=float(body["flow_shift"]),
                                         custom_ratio=custom)
    except (Wan22InputError, KeyError, TypeError, ValueError) as e:
        return web.json_response({"error": str(e)}, status=400)
    return web.json_response({"high": schedule.high_steps, "low": schedule.low_steps,
                              "boundary_ratio": schedule.boundary.ratio, "boundary_source": schedule.boundary.source,
                              "boundary_known": known, "summary": schedule.summary()})
