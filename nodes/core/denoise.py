"""The two-stage denoising loop of Wan2.2 A14B.

It reads like diffusers' WanPipeline loop, which it matches step for step: for each timestep of the
schedule's own scheduler, pick the expert by the rule that counted the split, run it with CFG at that
expert's scale, step the scheduler. Progress, interruption and device placement are callbacks, so
this module stays free of ComfyUI.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from . import cache, lora
from .errors import Wan22InputError
from .experts import Wan22Experts
from .schedule import Wan22Schedule, count_split

ROLES = ("high", "low")


class ExpertPlacement(Protocol):
    """Where experts live during a run. At most one expert is on the compute device at a time."""

    device: torch.device

    def activate(self, role: str, module: torch.nn.Module) -> None: ...

    def release(self) -> None: ...


class KeepInPlace:
    """Placement for plain use: everything stays where it is."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def activate(self, role, module):
        pass

    def release(self):
        pass


@dataclass
class StepRecord:
    index: int
    timestep: float
    sigma: float
    expert: str  # "high" | "low"
    forwards: int
    seconds: float


@dataclass
class RunRecord:
    """What a run did, step by step: the raw material of the report and the timeline."""

    split: tuple[int, int]
    steps: list[StepRecord] = field(default_factory=list)
    cache: dict = field(default_factory=dict)  # per expert: cache-dit statistics and block forwards

    def stage_seconds(self) -> dict[str, float]:
        return {role: round(sum(s.seconds for s in self.steps if s.expert == role), 4) for role in ROLES}

    def forwards(self) -> dict[str, int]:
        return {role: sum(s.forwards for s in self.steps if s.expert == role) for role in ROLES}

    def cached_flags(self) -> list[bool]:
        """Per run step: whether its (conditional) pass was served from the cache. cache-dit counts
        steps per context, i.e. per expert, so expert-local indices are mapped back to run steps."""
        flags, local = [], {role: 0 for role in ROLES}
        for step in self.steps:
            cached = set(self.cache.get(step.expert, {}).get("cached_steps", []))
            flags.append(local[step.expert] in cached)
            local[step.expert] += 1
        return flags


@dataclass
class DenoiseInputs:
    """One run's tensors, in model space: text embeddings [B, L, D], the initial noise [B, 16, F, H, W],
    and for image-to-video the 20 extra channels (4 mask + 16 image) [B, 20, F, H, W]."""

    positive: torch.Tensor
    negative: torch.Tensor
    noise: torch.Tensor
    condition: torch.Tensor | None = None


def check_run(experts: Wan22Experts, schedule: Wan22Schedule) -> None:
    """The schedule must have been resolved for these experts (it pins the boundary by what is loaded)."""
    if (schedule.has_high, schedule.has_low, schedule.model_default) != (
            experts.has_high, experts.has_low, experts.default_boundary):
        raise Wan22InputError("schedule", "this schedule was built for other experts; connect the schedule "
                                          "node's experts input to the same experts as the sampler's")


def denoise(experts: Wan22Experts, schedule: Wan22Schedule, inputs: DenoiseInputs, cfg_high: float,
            cfg_low: float, placement: ExpertPlacement | None = None,
            before_step: Callable[[int, int], None] | None = None,
            after_step: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, RunRecord]:
    """Denoises `inputs.noise` to the final latent (model space, fp32). Returns it with the run's record.

    `before_step(i, n)` may raise to interrupt; the placement is released whatever happens.
    """
    check_run(experts, schedule)
    placement = placement or KeepInPlace()
    device = placement.device
    scheduler = schedule.new_scheduler(device=device)
    split = count_split(scheduler.timesteps, schedule.boundary)
    record = RunRecord(split=split)
    modules = {"high": experts.high_noise, "low": experts.low_noise}
    scales = {"high": float(cfg_high), "low": float(cfg_low)}
    # What is installed on the shared experts belongs to the run: the handle's LoRA adapters, its cache
    # hooks; then each expert's context is sized with its share of the split counted from the scheduler
    # stepped below.
    lora.reconcile(experts)
    cache.reconcile(experts)
    cache_configs = cache.refresh(experts, split, scales)

    dtype = experts.dtype
    latents = inputs.noise.to(device=device, dtype=torch.float32)
    positive = inputs.positive.to(device=device, dtype=dtype)
    negative = inputs.negative.to(device=device, dtype=dtype)
    condition = None if inputs.condition is None else inputs.condition.to(device=device, dtype=torch.float32)
    total = len(scheduler.timesteps)
    counter = cache.BlockCounter()
    try:
        with torch.no_grad(), counter.counting(experts):
            for i, t in enumerate(scheduler.timesteps):
                if before_step is not None:
                    before_step(i, total)
                started = time.perf_counter()
                role = "high" if schedule.boundary.routes_high(t) else "low"  # the rule that counted the split
                model, guidance = modules[role], scales[role]
                placement.activate(role, model)

                model_input = latents if condition is None else torch.cat([latents, condition], dim=1)
                model_input = model_input.to(dtype)
                timestep = t.expand(latents.shape[0])
                noise_pred = model(hidden_states=model_input, timestep=timestep, encoder_hidden_states=positive,
                                   return_dict=False)[0]
                forwards = 1
                if guidance != 1.0:  # CFG: a scale of 1.0 is the conditional prediction alone
                    noise_uncond = model(hidden_states=model_input, timestep=timestep,
                                         encoder_hidden_states=negative, return_dict=False)[0]
                    noise_pred = noise_uncond + guidance * (noise_pred - noise_uncond)
                    forwards = 2

                latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
                record.steps.append(StepRecord(index=i, timestep=float(t), sigma=float(scheduler.sigmas[i]),
                                               expert=role, forwards=forwards,
                                               seconds=time.perf_counter() - started))
                if after_step is not None:
                    after_step(i + 1, total)
    finally:
        placement.release()
    record.cache = cache.statistics(experts, cache_configs, record.forwards(), counter.counts, split)
    return latents, record
