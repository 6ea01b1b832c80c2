"""Sampling a Wan2.2 A14B run: the stages the official template's two KSamplerAdvanced run, each through
ComfyUI's own `nodes.common_ksampler` on a clone of its expert with the run's flow shift (ComfyUI's noise,
noise mask, model management, progress bar, previews and interrupt), with the stage's Cache-DiT, if any,
installed for that stage only."""

from __future__ import annotations

import time
from dataclasses import dataclass

import comfy.patcher_extension
import nodes as comfyui_nodes

from .core import cache as core_cache
from .core import experts as core_experts
from .core.errors import Wan22InputError
from .core.experts import ROLE_WORDS
from .core.report import RunRecord, StepRecord
from .core.schedule import RunSchedule
from .stage_cache import StageCache
from .wrapper_calls import call_argument, prompts_in

WrappersMP = comfy.patcher_extension.WrappersMP


@dataclass(frozen=True)
class Stage:
    """One expert's part of a run, as one KSamplerAdvanced would run it."""

    role: str
    model: object  # a clone of the expert with the run's flow shift
    cfg: float
    start_step: int
    last_step: int
    add_noise: bool  # the first stage adds the seed's noise; the second continues from its latent
    full_denoise: bool  # False: return with the leftover noise for the next stage

    @property
    def steps(self) -> int:
        return self.last_step - self.start_step


def shifted(model, flow_shift: float):
    """A clone of `model` with the run's flow shift, as ModelSamplingSD3 patches it."""
    import comfy_extras.nodes_model_advanced as model_advanced

    return model_advanced.ModelSamplingSD3().patch(model, float(flow_shift))[0]


def check_run(experts, schedule: RunSchedule) -> None:
    """The schedule must have been resolved for these experts (it pins the boundary by what is loaded)."""
    if (schedule.has_high, schedule.has_low, schedule.model_default) != (
            experts.has_high, experts.has_low, experts.default_boundary):
        raise Wan22InputError("schedule", "this schedule was built for other experts; connect the schedule "
                                          "node's experts input to the same experts as the sampler's")


def plan_stages(experts, schedule: RunSchedule, cfg: dict[str, float]) -> list[Stage]:
    """High-noise expert from step 0 to the switch (leftover noise kept), then the low-noise expert to the
    end; an expert with no steps has no stage, and a lone stage runs as one KSampler."""
    check_run(experts, schedule)
    models = experts.models()
    bounds = {"high": (0, schedule.high_steps), "low": (schedule.high_steps, schedule.steps)}
    roles = [role for role in core_experts.ROLES if bounds[role][1] > bounds[role][0]]
    if experts.cache_plan is not None:  # refuses a sampler the cache cannot size before anything loads
        for role in roles:
            core_cache.evaluations_per_step(schedule.sampler, schedule.stage_sigmas(role))
    return [Stage(role=role, model=shifted(models[role], schedule.flow_shift), cfg=float(cfg[role]),
                  start_step=bounds[role][0], last_step=bounds[role][1], add_noise=i == 0,
                  full_denoise=i == len(roles) - 1) for i, role in enumerate(roles)]


class StageCalls:
    """What one stage's sampling really does, seen through wrappers on the stage's own clone: the sigmas it
    steps through, checked against the schedule's before any step runs (the split was counted from those),
    and the transformer calls with the prompts batched into them."""

    KEY = "wan22_stage_calls"

    def __init__(self, role: str, sigmas: tuple[float, ...]):
        self.role, self.sigmas = role, tuple(sigmas)
        self.calls = 0
        self.prompts = 0

    def attach(self, model) -> None:
        model.add_wrapper_with_key(WrappersMP.SAMPLER_SAMPLE, self.KEY, self.sampler_sample)
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, self.KEY, self.diffusion_model_call)

    def sampler_sample(self, executor, *args, **kwargs):
        seen = tuple(float(s) for s in call_argument(executor, args, kwargs, "sigmas"))
        if seen != self.sigmas:
            raise Wan22InputError("schedule", f"ComfyUI's sampling would step the {ROLE_WORDS[self.role]} stage "
                                              f"through the sigmas {[round(s, 6) for s in seen]}, not the "
                                              f"{[round(s, 6) for s in self.sigmas]} the split was counted from; "
                                              "nothing was run. Please report it with your ComfyUI version")
        return executor(*args, **kwargs)

    def diffusion_model_call(self, executor, *args, **kwargs):
        self.calls += 1
        self.prompts += prompts_in(call_argument(executor, args, kwargs, "transformer_options"))
        return executor(*args, **kwargs)


def run_stage(stage: Stage, schedule: RunSchedule, positive, negative, latent: dict, seed: int) -> dict:
    """One stage exactly as a KSamplerAdvanced runs it: ComfyUI's own common_ksampler, which computes the
    sigmas from the clone's model sampling (StageCalls checks they are the schedule's). It takes no callback,
    so its progress bar and previews run once per stage, as on the template's two KSamplerAdvanced."""
    return comfyui_nodes.common_ksampler(
        stage.model, seed, schedule.steps, stage.cfg, schedule.sampler, schedule.scheduler, positive, negative,
        latent, denoise=1.0, disable_noise=not stage.add_noise, start_step=stage.start_step,
        last_step=stage.last_step, force_full_denoise=stage.full_denoise)[0]


def sample(experts, schedule: RunSchedule, positive, negative, latent: dict, seed: int,
           cfg: dict[str, float]) -> tuple[dict, RunRecord]:
    """Runs the stages through ComfyUI's sampling; returns the LATENT (a new dict) and what the run did."""
    stages = plan_stages(experts, schedule, cfg)
    plan = experts.cache_plan
    record = RunRecord(split=schedule.split)
    out = latent
    for stage in stages:
        calls = StageCalls(stage.role, schedule.stage_sigmas(stage.role))
        calls.attach(stage.model)
        cache = StageCache(plan, stage.role, schedule.sampler) if plan is not None else None
        if cache is not None:
            cache.attach(stage.model)
        started = time.perf_counter()
        out = run_stage(stage, schedule, positive, negative, out, seed)
        record.seconds[stage.role] = round(time.perf_counter() - started, 4)
        record.calls[stage.role], record.forward_passes[stage.role] = calls.calls, calls.prompts
        per_step = cache.per_step if cache is not None else [1] * stage.steps
        record.steps += [StepRecord(index=stage.start_step + i, sigma=schedule.sigmas[stage.start_step + i],
                                    expert=stage.role, evaluations=n) for i, n in enumerate(per_step)]
        if cache is not None:
            record.cache[stage.role] = core_cache.statistics(
                plan, stage.role, cache.summary, cache.config.strify(), cache.evaluations, cache.cfg_batching,
                cache.pass_order, calls.calls, cache.block_forwards, experts.architecture.num_layers)
    return out, record
