"""Wan2.2 Two-Stage Sampler: the whole two-expert run through ComfyUI's own sampling, as the official
template's two KSamplerAdvanced run it, with the switch taken from the schedule."""

from __future__ import annotations

import json

import torch
from comfy_api.latest import io

from .core import report, sampler_inputs, timeline
from .dispatch import run
from .types import CATEGORY, ExpertsType, ScheduleType, linked_given, linked_only


class Wan22TwoStageSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22TwoStageSampler",
            display_name="Wan2.2 Two-Stage Sampler",
            category=CATEGORY,
            description="Denoises a Wan2.2 A14B run with ComfyUI's own sampler: the high-noise expert from the first "
                        "step to the schedule's switch (keeping its leftover noise), then the low-noise expert to "
                        "the end, each with its own CFG, as two KSamplerAdvanced would. A schedule with a lead stage "
                        "(Wan2.2 Lead Stage) runs that stage first, on its own expert, CFG and sigmas.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts (with their LoRAs and Cache-DiT plan, if any)."),
                ScheduleType.Input("schedule", tooltip="From Wan2.2 Boundary & Flow Shift, built on the same "
                                                       "experts (or from Wan2.2 Lead Stage, for three stages)."),
                io.Conditioning.Input("positive", tooltip="Text conditioning from the umt5 text encoder; through "
                                                          "WanImageToVideo for image-to-video."),
                io.Conditioning.Input("negative", tooltip="Negative text conditioning (used when a CFG scale is "
                                                          "not 1.0)."),
                io.Latent.Input("latent_image", tooltip="The latent to denoise (Empty Latent Video or "
                                                        "WanImageToVideo). It is denoised fully, from noise, as by a "
                                                        "KSampler at denoise 1.0; its noise_mask is honoured."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             tooltip="Noise seed; the same seed gives the same noise as in a KSampler."),
                io.Float.Input("cfg_high", default=4.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG scale of the high-noise expert. 1.0 runs one transformer call per step "
                                       "(no negative pass). Wan2.2 T2V: 4.0, I2V: 3.5; LightX2V 4-step: 1.0."),
                io.Float.Input("cfg_low", default=3.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG scale of the low-noise expert. 1.0 runs one transformer call per step. "
                                       "Wan2.2 T2V: 3.0, I2V: 3.5; LightX2V 4-step: 1.0."),
            ],
            outputs=[
                io.Latent.Output(display_name="latent", tooltip="The denoised latent, for VAE Decode."),
                io.String.Output(display_name="report", tooltip="JSON: schedule, sigmas, split, LoRAs, time, "
                                                                "transformer calls and cache statistics per expert."),
                io.Image.Output(display_name="timeline", tooltip="Sigma per step, the boundary, and which expert "
                                                                 "ran each step."),
            ],
        )

    @classmethod
    def validate_inputs(cls, experts=None, schedule=None, positive=None, negative=None, latent_image=None):
        return linked_only(experts=experts, schedule=schedule, positive=positive, negative=negative,
                           latent_image=latent_image)

    @classmethod
    def execute(cls, experts, schedule, positive, negative, latent_image, seed, cfg_high, cfg_low) -> io.NodeOutput:
        linked_given(experts=experts, schedule=schedule, positive=positive, negative=negative,
                     latent_image=latent_image)
        sampler_inputs.check_sampler_inputs(experts.architecture, positive, negative, latent_image)
        cfg = {"high": float(cfg_high), "low": float(cfg_low)}
        latent, record = run(experts, schedule, positive, negative, latent_image, seed, cfg)
        run_report = report.build_report(experts, schedule.schedule, record, seed=seed, cfg=cfg)
        picture = torch.from_numpy(timeline.render_timeline(schedule.schedule, record)).float().div(255.0).unsqueeze(0)
        ui = {"text": [report.summary_line(run_report)], "report": [run_report]}
        if experts.cache_node is not None and record.cache:
            ui["cache_used"] = [{"node": experts.cache_node, "text": report.cache_used_line(run_report)}]
        return io.NodeOutput(latent, json.dumps(run_report), picture, ui=ui)
