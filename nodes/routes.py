"""A small route on ComfyUI's server: the split of a schedule, computed by the same core function the
schedule node uses, so the canvas can show it live as the widgets change."""

from __future__ import annotations

from aiohttp import web
from server import PromptServer

from .core import experts as core_experts
from .core import schedule as core_schedule
from .core.errors import Wan22InputError
from .loader_nodes import NONE, diffusers_folder_path, expert_path

ROUTE = "/wan22/split"


def loaded_experts(loader: dict) -> tuple[bool, bool, float]:
    """(has_high, has_low, model default boundary) of a loader node's widget values, from file headers."""
    kind, values = loader.get("type"), loader.get("values") or {}
    if kind == "Wan22DiffusersExpertLoader":
        choice = values.get("experts", "both")
        configs, declared = core_experts.inspect_diffusers_folder(diffusers_folder_path(values.get("model_folder", "")),
                                                                  choice)
        default = core_experts.default_boundary(next(iter(configs.values())), declared)
        return "high_noise" in configs, "low_noise" in configs, default
    if kind == "Wan22ExpertLoader":
        high, low = values.get("high_noise_model", NONE), values.get("low_noise_model", NONE)
        core_experts.require_some_expert(high, low)
        configs = core_experts.inspect_single_files({"high_noise": expert_path("high_noise_model", high),
                                                     "low_noise": expert_path("low_noise_model", low)})
        return high != NONE, low != NONE, core_experts.default_boundary(next(iter(configs.values())))
    raise Wan22InputError("experts", "connect the experts input to a Wan2.2 expert loader")


@PromptServer.instance.routes.post(ROUTE)
async def split(request: web.Request) -> web.Response:
    try:
        body = await request.json()
        has_high, has_low, default = loaded_experts(body.get("loader") or {})
        custom = float(body["boundary_ratio"]) if body.get("boundary") == "custom" else None
        core_schedule.check_schedule_inputs(body.get("sampler"), body.get("steps"), body.get("flow_shift"),
                                            body.get("boundary"), custom)
        schedule = core_schedule.build_schedule(sampler=body["sampler"], steps=int(body["steps"]),
                                                flow_shift=float(body["flow_shift"]), has_high=has_high,
                                                has_low=has_low, model_default=default, custom_ratio=custom)
    except (Wan22InputError, KeyError, TypeError, ValueError) as e:
        return web.json_response({"error": str(e)}, status=400)
    return web.json_response({"high": schedule.high_steps, "low": schedule.low_steps,
                              "boundary_ratio": schedule.boundary.ratio,
                              "boundary_source": schedule.boundary.source, "summary": schedule.summary()})
