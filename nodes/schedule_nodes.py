"""Wan2.2 Boundary & Flow Shift: resolves the boundary and counts the high/low split of this run from the
very sigmas ComfyUI's sampling will step through."""

from __future__ import annotations

import torch
from comfy_api.latest import io

import comfy.samplers

from . import sigmas
from .core import schedule as core
from .core.errors import Wan22InputError
from .types import CATEGORY, ExpertsType, ScheduleType


def boundary_ratio_input() -> io.Float.Input:
    # Optional: an API prompt saved before the boundary became a dynamic input has a top-level
    # `boundary_ratio` instead, which `execute` still reads.
    return io.Float.Input("boundary_ratio", default=core.DEFAULT_CUSTOM_BOUNDARY, min=0.0, max=1.0, step=0.005,
                          optional=True,
                          tooltip="Steps whose sigma is at or above it run on the high-noise expert, the rest on "
                                  "the low-noise expert.")


class Wan22Schedule(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22Schedule",
            display_name="Wan2.2 Boundary & Flow Shift",
            category=CATEGORY,
            description="Builds this run's sigmas with ComfyUI's own sampler and scheduler and counts how many steps "
                        "each expert gets: a step runs on the high-noise expert while its sigma is at or above the "
                        "boundary. The split depends on sampler, scheduler, steps and flow shift together.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The loaded experts: with only one loaded, every step "
                                                      "runs on it and the boundary is ignored."),
                io.Combo.Input("sampler", options=list(comfy.samplers.KSampler.SAMPLERS), default=core.DEFAULT_SAMPLER,
                               tooltip="ComfyUI's KSampler sampler. uni_pc is the official Wan2.2 sampler; euler "
                                       "with the simple scheduler is the LightX2V 4-step schedule. Workflows saved "
                                       "with the old names still run: unipc = uni_pc, euler = euler, dpmpp = "
                                       "dpmpp_2m."),
                io.Int.Input("steps", default=40, min=1, max=core.MAX_STEPS,
                             tooltip="Denoising steps of the whole run (both experts together). Wan2.2: 40."),
                io.Float.Input("flow_shift", default=12.0, min=0.01, max=100.0, step=0.1,
                               tooltip="Shift of the flow-matching sigmas, applied as ModelSamplingSD3 applies it; "
                                       "higher spends more steps at high noise. Wan2.2: 12.0 text-to-video, 5.0 "
                                       "image-to-video; ComfyUI's template: 5.0."),
                io.DynamicCombo.Input("boundary", options=[
                    io.DynamicCombo.Option("auto", []),
                    io.DynamicCombo.Option("custom", [boundary_ratio_input()]),
                ], tooltip="auto: the model's boundary (0.875 text-to-video, 0.900 image-to-video, or the diffusers "
                           "folder's own). custom: the boundary_ratio it shows."),
                io.Combo.Input("scheduler", options=list(comfy.samplers.KSampler.SCHEDULERS),
                               default=core.DEFAULT_SCHEDULER, optional=True,
                               tooltip="ComfyUI's scheduler: how the sigmas are spaced. simple gives the "
                                       "flow-matching sigmas of the official template."),
            ],
            outputs=[
                ScheduleType.Output(display_name="schedule", tooltip="The schedule, for the sampler."),
                io.Int.Output(display_name="high_steps", tooltip="Steps on the high-noise expert (the switch step)."),
                io.Int.Output(display_name="low_steps", tooltip="Steps on the low-noise expert."),
                io.Sigmas.Output(display_name="sigmas_high", tooltip="The high-noise expert's sigmas, for a native "
                                                                    "SamplerCustomAdvanced."),
                io.Sigmas.Output(display_name="sigmas_low", tooltip="The low-noise expert's sigmas, for a native "
                                                                   "SamplerCustomAdvanced (add no noise)."),
            ],
            # Old API prompts carry `boundary_ratio` at the top level: ComfyUI passes it on to `execute` only
            # when the node accepts inputs its schema does not list.
            accept_all_inputs=True,
        )

    @classmethod
    def validate_inputs(cls, sampler, scheduler=None, boundary=None, boundary_ratio=None):
        # Named here, so ComfyUI's own list check steps aside: old sampler names still load and run. ComfyUI
        # hands a dynamic input's value over to this function whole, so `boundary` must be named too (its
        # boundary_ratio keeps ComfyUI's own range check).
        try:
            if sampler is not None:
                core.sampler_name(sampler, comfy.samplers.KSampler.SAMPLERS)
            core.check_schedule_inputs(scheduler=scheduler, schedulers=comfy.samplers.KSampler.SCHEDULERS)
            core.custom_boundary(boundary, boundary_ratio)  # the mode, and an old prompt's top-level ratio
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, experts, sampler, steps, flow_shift, boundary=None, scheduler=core.DEFAULT_SCHEDULER,
                boundary_ratio=None, **_unknown) -> io.NodeOutput:
        # ComfyUI's own range checks refuse widget values at queue time; this also covers linked values.
        custom = core.custom_boundary(boundary, boundary_ratio)
        schedule = sigmas.build_schedule(has_high=experts.has_high, has_low=experts.has_low,
                                         model_default=experts.default_boundary, sampler=sampler, scheduler=scheduler,
                                         steps=steps, flow_shift=flow_shift, custom_ratio=custom)
        ui = {"text": [schedule.summary()],
              "split": [{"high": schedule.high_steps, "low": schedule.low_steps,
                         "boundary_ratio": schedule.boundary.ratio, "boundary_source": schedule.boundary.source}]}
        return io.NodeOutput(schedule, schedule.high_steps, schedule.low_steps,
                             torch.tensor(schedule.stage_sigmas("high")), torch.tensor(schedule.stage_sigmas("low")),
                             ui=ui)
