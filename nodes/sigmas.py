"""The sigmas of a run, as ComfyUI's own KSampler computes them, and the schedule counted from them: what
the schedule node and the canvas's live split both use, so that nothing computes the schedule a second way."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import comfy.samplers

from .core import schedule as core_schedule
from .core.schedule import RunSchedule


class _SamplingOnly:
    """What ModelSamplingSD3 patches and ComfyUI's KSampler reads to compute the sigmas: a model's model
    sampling, nothing else (no weights)."""

    model = SimpleNamespace(model_config=None)  # ComfyUI's flow sampling takes its defaults without a config

    def __init__(self):
        self.model_sampling = None

    def clone(self):
        return _SamplingOnly()

    def add_object_patch(self, name, value):
        if name != "model_sampling":
            raise KeyError(name)
        self.model_sampling = value

    def get_model_object(self, name):
        if name != "model_sampling":
            raise KeyError(name)
        return self.model_sampling


def shifted_sampling(flow_shift: float) -> _SamplingOnly:
    """The model sampling of a model with the run's flow shift, made by ComfyUI's own ModelSamplingSD3 (what
    the sampler puts on each expert: engine.shifted)."""
    from comfy_extras.nodes_model_advanced import ModelSamplingSD3

    return ModelSamplingSD3().patch(_SamplingOnly(), float(flow_shift))[0]


def run_sigmas(sampler: str, scheduler: str, steps: int, flow_shift: float) -> torch.Tensor:
    """The sigmas ComfyUI's KSampler steps through for these settings (N + 1 values, ending at 0), computed
    by KSampler itself: its scheduler and its own rule for the samplers that drop the penultimate sigma.
    The sampler checks, stage by stage, that ComfyUI's sampling steps through exactly these."""
    return comfy.samplers.KSampler(shifted_sampling(flow_shift), steps=int(steps), device="cpu", sampler=sampler,
                                   scheduler=scheduler, denoise=1.0).sigmas.float()


def build_schedule(*, has_high: bool, has_low: bool, model_default: float, sampler: str, scheduler: str, steps: int,
                   flow_shift: float, custom_ratio: float | None = None) -> RunSchedule:
    """The one way a schedule is made: for the schedule node and for the canvas's live split alike."""
    sampler = core_schedule.sampler_name(sampler, comfy.samplers.KSampler.SAMPLERS)
    return core_schedule.build_schedule(sampler=sampler, scheduler=scheduler, steps=steps, flow_shift=flow_shift,
                                        sigmas=lambda: run_sigmas(sampler, scheduler, steps, flow_shift).tolist(),
                                        has_high=has_high, has_low=has_low, model_default=model_default,
                                        custom_ratio=custom_ratio, schedulers=comfy.samplers.KSampler.SCHEDULERS)
