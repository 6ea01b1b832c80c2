"""The sigmas of a run, as ComfyUI's own KSampler computes them, and the schedule counted from them: what
the schedule node and the canvas's live split both use, so that nothing computes the schedule a second way."""

from __future__ import annotations

import torch

import comfy.model_sampling
import comfy.samplers

from .core import schedule as core_schedule
from .core.schedule import RunSchedule


class _FlowSampling(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
    """The kind of model sampling ModelSamplingSD3 puts on a model (a discrete flow with a shift)."""


class _SamplingOnly:
    """What ComfyUI's KSampler asks of a model to compute its sigmas: the model sampling, nothing else."""

    def __init__(self, model_sampling):
        self.model_sampling = model_sampling

    def get_model_object(self, name):
        if name != "model_sampling":
            raise KeyError(name)
        return self.model_sampling


def flow_model_sampling(flow_shift: float):
    model_sampling = _FlowSampling()
    model_sampling.set_parameters(shift=float(flow_shift), multiplier=1000)
    return model_sampling


def run_sigmas(sampler: str, scheduler: str, steps: int, flow_shift: float) -> torch.Tensor:
    """The sigmas ComfyUI's KSampler steps through for these settings (N + 1 values, ending at 0), computed
    by KSampler itself: its scheduler and its own rule for the samplers that drop the penultimate sigma.
    The sampler checks, stage by stage, that ComfyUI's sampling steps through exactly these."""
    model = _SamplingOnly(flow_model_sampling(flow_shift))
    return comfy.samplers.KSampler(model, steps=int(steps), device="cpu", sampler=sampler, scheduler=scheduler,
                                   denoise=1.0).sigmas.float()


def build_schedule(*, has_high: bool, has_low: bool, model_default: float, sampler: str, scheduler: str, steps: int,
                   flow_shift: float, custom_ratio: float | None = None) -> RunSchedule:
    """The one way a schedule is made: for the schedule node and for the canvas's live split alike."""
    sampler = core_schedule.sampler_name(sampler, comfy.samplers.KSampler.SAMPLERS)
    core_schedule.check_schedule_inputs(steps=steps, flow_shift=flow_shift, boundary_ratio=custom_ratio,
                                        scheduler=scheduler, schedulers=comfy.samplers.KSampler.SCHEDULERS)
    sigmas = run_sigmas(sampler, scheduler, steps, flow_shift)
    return core_schedule.build_schedule(sampler=sampler, scheduler=scheduler, steps=steps, flow_shift=flow_shift,
                                        sigmas=sigmas.tolist(), has_high=has_high, has_low=has_low,
                                        model_default=model_default, custom_ratio=custom_ratio)
