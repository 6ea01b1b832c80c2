"""Wan2.2 Boundary & Flow Shift: resolves the boundary and counts the high/low split of this run from the
very sigmas ComfyUI's sampling will step through."""

from __future__ import annotations

import torch
from comfy_api.latest import io

import comfy.samplers

from . import sigmas
from .core import schedule as core
from .core.errors import Wan22InputError
from .types import CATEGORY, ExpertsType, ScheduleHandle, ScheduleType, linked_given, linked_only


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
    def validate_inputs(cls, sampler=None, scheduler=None, boundary=None, boundary_ratio=None, experts=None):
        # Named here, so ComfyUI's own list check steps aside: old sampler names still load and run. ComfyUI
        # hands a dynamic input's value over to this function whole, so `boundary` must be named too (its
        # boundary_ratio keeps ComfyUI's own range check).
        linked = linked_only(experts=experts)
        if linked is not True:
            return linked
        try:
            if sampler is not None:
                core.sampler_name(sampler, comfy.samplers.KSampler.SAMPLERS)
            core.check_schedule_inputs(scheduler=scheduler, schedulers=comfy.samplers.KSampler.SCHEDULERS)
            core.custom_boundary(boundary, boundary_ratio)  # the mode, and an old prompt's top-level ratio
        except Wan22InputError as e:
            return str(e)
        return True

    @classmethod
    def preview(cls, experts, sampler, steps, flow_shift, boundary=None, scheduler=core.DEFAULT_SCHEDULER,
                boundary_ratio=None, **_unknown):
        """The schedule these inputs make for `experts` (the handle, or a loader's preview of it): what the node
        runs, and what the canvas's live split shows before anything loads."""
        # ComfyUI's own range checks refuse widget values at queue time; this also covers linked values.
        custom = core.custom_boundary(boundary, boundary_ratio)
        return sigmas.build_schedule(has_high=experts.has_high, has_low=experts.has_low,
                                     model_default=experts.default_boundary, sampler=sampler,
                                     scheduler=scheduler or core.DEFAULT_SCHEDULER, steps=steps,
                                     flow_shift=flow_shift, custom_ratio=custom)

    @classmethod
    def execute(cls, experts, sampler, steps, flow_shift, boundary=None, scheduler=core.DEFAULT_SCHEDULER,
                boundary_ratio=None, **_unknown) -> io.NodeOutput:
        linked_given(experts=experts)
        schedule = cls.preview(experts, sampler, steps, flow_shift, boundary, scheduler, boundary_ratio)
        ui = {"text": [schedule.summary()], "split": [split_ui(schedule)]}
        return io.NodeOutput(ScheduleHandle(schedule), schedule.high_steps, schedule.low_steps,
                             torch.tensor(schedule.stage_sigmas("high")), torch.tensor(schedule.stage_sigmas("low")),
                             ui=ui)


LEAD_DEFAULTS = {"lead_steps": 24, "start_step": 1, "cfg": 3.5}  # the three-stage LightX2V recipe at 8 steps


def lead_schedule(schedule, experts, lead_steps: int, start_step: int, cfg: float):
    """The schedule with a lead stage on `experts`' high-noise expert: the one way it is made, for the node
    and for the canvas's live split."""
    def lead_sigmas():
        return sigmas.run_sigmas(schedule.sampler, schedule.scheduler, lead_steps, schedule.flow_shift).tolist()
    handle = getattr(experts, "sources", None) is not None  # a loader's preview names no file yet
    return core.add_lead(schedule, lead_sigmas=lead_sigmas, steps=lead_steps, start_step=start_step, cfg=cfg,
                         source=experts.sources[0] if handle else "MODEL",
                         architecture=experts.architecture if handle else None)


def split_ui(schedule) -> dict:
    """The split the canvas shows for a schedule (with its lead stage, if any)."""
    split = {"high": schedule.high_steps, "low": schedule.low_steps, "boundary_ratio": schedule.boundary.ratio,
             "boundary_source": schedule.boundary.source}
    if schedule.lead is not None:
        split.update(schedule.stage_split(), lead_steps=schedule.lead.steps,
                     start_step=schedule.lead.start_step, hand_off_exact=schedule.lead.exact)
    return split


class Wan22LeadStage(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22LeadStage",
            display_name="Wan2.2 Lead Stage (three stages)",
            category=CATEGORY,
            description="Puts a lead stage in front of a schedule, for the three-stage LightX2V recipe: the high-noise "
                        "expert without the LoRAs, at its own CFG, steps a finer schedule of its own (same sampler, "
                        "scheduler and flow shift) until its sigma reaches the one the main schedule's start_step "
                        "starts from; the main schedule then runs from that step, split at the boundary. Where no "
                        "lead sigma equals it, the lead's last step ends exactly there (the node text says so).",
            inputs=[
                ScheduleType.Input("schedule", tooltip="The main schedule, from Wan2.2 Boundary & Flow Shift (e.g. "
                                                       "8 LightX2V steps, shift 5)."),
                ExpertsType.Input("experts", tooltip="The experts whose high-noise expert runs the lead: connect "
                                                     "the handle from before the LoRA node (without the LoRAs)."),
                io.Int.Input("lead_steps", default=LEAD_DEFAULTS["lead_steps"], min=1, max=core.MAX_LEAD_STEPS,
                             tooltip="Steps of the lead's own finer schedule; it runs only its first ones, down to "
                                     "the main start. 24 with 8 main steps: 3 lead steps cover the main's first."),
                io.Int.Input("start_step", default=LEAD_DEFAULTS["start_step"], min=1, max=core.MAX_STEPS - 1,
                             tooltip="The main schedule's step where the lead hands over; the main schedule's steps "
                                     "before it are the lead's. LightX2V recipe: 1."),
                io.Float.Input("cfg", default=LEAD_DEFAULTS["cfg"], min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG scale of the lead stage (its negative prompt gives the motion back). "
                                       "Recipe: 3.5."),
            ],
            outputs=[
                ScheduleType.Output(display_name="schedule", tooltip="The schedule with the lead stage, for the "
                                                                     "sampler."),
                io.Sigmas.Output(display_name="sigmas_lead", tooltip="The lead stage's sigmas, for a native "
                                                                    "SamplerCustomAdvanced (adds the noise)."),
                io.Sigmas.Output(display_name="sigmas_high", tooltip="The main high-noise stage's sigmas (add no "
                                                                    "noise)."),
                io.Sigmas.Output(display_name="sigmas_low", tooltip="The low-noise stage's sigmas (add no noise)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, schedule=None, experts=None):
        return linked_only(schedule=schedule, experts=experts)

    @classmethod
    def preview(cls, schedule, experts, lead_steps, start_step, cfg):
        """The schedule with this lead (`schedule`: core's; `experts`: the handle, a loader's preview of it, or
        None where the canvas cannot tell): what the node runs, and what the canvas's live split shows."""
        if experts is not None and not experts.has_high:
            raise Wan22InputError("experts", "the lead stage runs the high-noise expert, but these experts have "
                                             "none: connect experts with a high-noise expert")
        return lead_schedule(schedule, experts, lead_steps, start_step, cfg)

    @classmethod
    def execute(cls, schedule, experts, lead_steps, start_step, cfg) -> io.NodeOutput:
        linked_given(schedule=schedule, experts=experts)
        led = cls.preview(schedule.schedule, experts, lead_steps, start_step, cfg)
        ui = {"text": [led.summary()], "split": [split_ui(led)]}
        return io.NodeOutput(ScheduleHandle(led, lead_model=experts.high),
                             *(torch.tensor(led.stage_sigmas(stage)) for stage in core.STAGES), ui=ui)
