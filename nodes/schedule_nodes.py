"""Wan2.2 Boundary & Flow Shift: resolves the boundary and counts the high/low split of this run."""

from __future__ import annotations

from comfy_api.latest import io

from .core import schedule as core
from .types import CATEGORY, ExpertsType, ScheduleType


class Wan22Schedule(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22Schedule",
            display_name="Wan2.2 Boundary & Flow Shift",
            category=CATEGORY,
            description="Builds this run's noise schedule and counts how many steps each expert gets. The "
                        "split depends on sampler, steps and flow shift together.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The loaded experts: with only one loaded, every step "
                                                      "runs on it and the boundary is ignored."),
                io.Combo.Input("sampler", options=list(core.SAMPLERS), default="unipc",
                               tooltip="unipc: UniPC multistep, the official Wan2.2 sampler. euler: flow-match "
                                       "Euler. dpmpp: DPM-Solver++ multistep. All from diffusers."),
                io.Int.Input("steps", default=40, min=1, max=core.MAX_STEPS,
                             tooltip="Denoising steps of the whole run (both experts together). Wan2.2: 40."),
                io.Float.Input("flow_shift", default=12.0, min=0.01, max=100.0, step=0.1,
                               tooltip="Shift of the flow-matching sigmas; higher spends more steps at high "
                                       "noise. Wan2.2 uses 12.0 for text-to-video, 5.0 for image-to-video."),
                io.Combo.Input("boundary", options=list(core.BOUNDARY_MODES), default="auto",
                               tooltip="auto: the model's boundary (0.875 text-to-video, 0.900 image-to-video, "
                                       "or the diffusers folder's own). custom: boundary_ratio below."),
                io.Float.Input("boundary_ratio", default=0.875, min=0.0, max=1.0, step=0.005,
                               tooltip="Used when boundary is custom: steps whose timestep is at or above "
                                       "boundary_ratio x 1000 run on the high-noise expert, the rest on the "
                                       "low-noise expert."),
            ],
            outputs=[
                ScheduleType.Output(display_name="schedule", tooltip="The schedule, for the sampler."),
                io.Int.Output(display_name="high_steps", tooltip="Steps on the high-noise expert."),
                io.Int.Output(display_name="low_steps", tooltip="Steps on the low-noise expert."),
            ],
        )

    @classmethod
    def execute(cls, experts, sampler, steps, flow_shift, boundary, boundary_ratio) -> io.NodeOutput:
        # ComfyUI's own range checks refuse widget values at queue time; this also covers linked values.
        core.check_schedule_inputs(sampler, steps, flow_shift, boundary,
                                   boundary_ratio if boundary == "custom" else None)
        schedule = core.build_schedule(sampler=sampler, steps=steps, flow_shift=flow_shift,
                                       has_high=experts.has_high, has_low=experts.has_low,
                                       model_default=experts.default_boundary,
                                       custom_ratio=boundary_ratio if boundary == "custom" else None)
        ui = {"text": [schedule.summary()],
              "split": [{"high": schedule.high_steps, "low": schedule.low_steps,
                         "boundary_ratio": schedule.boundary.ratio, "boundary_source": schedule.boundary.source}]}
        return io.NodeOutput(schedule, schedule.high_steps, schedule.low_steps, ui=ui)
