"""Wan2.2 Two-Stage Sampler: the whole denoising run, native CONDITIONING and LATENT in and out."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys

import torch
from comfy_api.latest import io

import comfy.model_management as mm
import comfy.utils

from .core import denoise, latents, report, sampler_inputs, timeline
from .types import CATEGORY, ExpertsType, ScheduleType


def _return_freed_heap_to_os() -> None:
    """A run's activations fragment glibc's heap; without a trim a long-running server's RSS creeps up
    with every large run even though nothing is leaked (measured by bench/endurance.py)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


class ComfyPlacement:
    """One expert on the compute device at a time: ComfyUI frees memory before an expert is moved in,
    the idle expert goes back to the offload device. Every move is recorded for the report."""

    def __init__(self):
        self.device = mm.get_torch_device()
        self.offload_device = mm.unet_offload_device()
        self.resident: dict[str, torch.nn.Module] = {}
        self.moves: list[list[str]] = []

    def activate(self, role, module):
        if role in self.resident:
            return
        for other, other_module in list(self.resident.items()):
            other_module.to(self.offload_device)
            del self.resident[other]
            self.moves.append([other, "offload"])
        mm.soft_empty_cache()
        mm.free_memory(mm.module_size(module), self.device)
        module.to(self.device)
        self.resident[role] = module
        self.moves.append([role, "compute"])

    def release(self):
        for role, module in list(self.resident.items()):
            module.to(self.offload_device)
            del self.resident[role]
            self.moves.append([role, "offload"])
        mm.soft_empty_cache()
        _return_freed_heap_to_os()


class Wan22TwoStageSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22TwoStageSampler",
            display_name="Wan2.2 Two-Stage Sampler",
            category=CATEGORY,
            description="Denoises a Wan2.2 A14B run in one pass over the schedule: the high-noise expert for "
                        "the steps at or above the boundary, the low-noise expert after, each with its own CFG.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts (optionally with LoRAs and a Cache-DiT plan, applied for this run)."),
                ScheduleType.Input("schedule", tooltip="From Wan2.2 Boundary & Flow Shift, built on the same "
                                                       "experts."),
                io.Conditioning.Input("positive", tooltip="Text conditioning from the umt5 text encoder; through "
                                                          "WanImageToVideo for image-to-video."),
                io.Conditioning.Input("negative", tooltip="Negative text conditioning (used when a CFG scale is "
                                                          "not 1.0)."),
                io.Latent.Input("latent_image", tooltip="Gives the video's size, length and batch (Empty Latent "
                                                        "Video or WanImageToVideo). The run starts from pure noise, "
                                                        "as a KSampler at denoise 1.0."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             tooltip="Noise seed; the same seed gives the same noise as in a KSampler."),
                io.Float.Input("cfg_high", default=4.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG scale of the high-noise expert. 1.0 runs one forward per step (no "
                                       "negative pass). Wan2.2 T2V: 4.0, I2V: 3.5."),
                io.Float.Input("cfg_low", default=3.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG scale of the low-noise expert. 1.0 runs one forward per step. "
                                       "Wan2.2 T2V: 3.0, I2V: 3.5."),
            ],
            outputs=[
                io.Latent.Output(display_name="latent", tooltip="The denoised latent, in VAE space for VAE Decode."),
                io.String.Output(display_name="report", tooltip="JSON: schedule, split, LoRAs, time, forward "
                                                                "passes and cache statistics per expert."),
                io.Image.Output(display_name="timeline", tooltip="Sigma per step, the boundary, and which expert "
                                                                 "ran each step."),
            ],
        )

    @classmethod
    def execute(cls, experts, schedule, positive, negative, latent_image, seed, cfg_high, cfg_low) -> io.NodeOutput:
        inputs = sampler_inputs.prepare_inputs(experts, positive, negative, latent_image, seed)
        placement = ComfyPlacement()
        progress = comfy.utils.ProgressBar(schedule.steps)
        result, record = denoise.denoise(
            experts, schedule, inputs, cfg_high, cfg_low, placement=placement,
            before_step=lambda i, n: mm.throw_exception_if_processing_interrupted(),
            after_step=lambda i, n: progress.update_absolute(i, n))

        out = dict(latent_image)  # a copy: the input dict is shared with other consumers
        out["samples"] = latents.to_vae_space(result).to(mm.intermediate_device())
        run_report = report.build_report(experts, schedule, record, seed=seed, cfg_high=cfg_high,
                                         cfg_low=cfg_low, device_moves=placement.moves)
        picture = torch.from_numpy(timeline.render_timeline(schedule, record)).float().div(255.0).unsqueeze(0)
        return io.NodeOutput(out, json.dumps(run_report), picture,
                             ui={"text": [report.summary_line(run_report)], "report": [run_report]})
