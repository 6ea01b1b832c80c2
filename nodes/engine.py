"""Sampling a Wan2.2 A14B run: a list of stages (the two the official template's KSamplerAdvanced run, and a
lead stage in front for the three-stage recipe), each through ComfyUI's own `nodes.common_ksampler` on a
clone of its expert with the run's flow shift (ComfyUI's noise, noise mask, model management, progress bar,
previews and interrupt), with the stage's Cache-DiT, if any, installed for that stage only."""

from __future__ import annotations

import time
from dataclasses import dataclass

import nodes as comfyui_nodes

from .core import cache as cache_core
from .core.architecture import SINGLE
from .core.errors import Wan22InputError
from .core.report import RunRecord, StepRecord
from .core.schedule import RunSchedule
from .stage_cache import StageCache
from .stage_calls import StageCalls


@dataclass(frozen=True)
class Stage:
    """One stage of a run, as one KSamplerAdvanced (or, for a lead stage whose last step is its own, one
    SamplerCustomAdvanced) would run it."""

    name: str  # "lead" | "high" | "low"
    role: str  # the expert it runs on: "high" | "low"
    model: object  # a clone of the expert with the run's flow shift
    cfg: float
    steps: int  # the steps of the schedule it is part of (the lead's own, or the main one)
    start_step: int
    last_step: int
    sigmas: tuple[float, ...]  # what it steps through (checked against ComfyUI's own when it runs)
    add_noise: bool  # the first stage adds the seed's noise; the others continue from the latent
    full_denoise: bool  # False: return with the leftover noise for the next stage
    own_sigmas: bool = False  # a lead stage whose last step is its own: run on its sigmas, not on a KSampler's


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
    lead = schedule.lead
    if lead is not None and lead.architecture != experts.architecture:
        raise Wan22InputError("schedule", f"the lead stage's expert ({lead.architecture.describe()}) is not the same "
                                          f"model as the sampler's experts ({experts.architecture.describe()}): give "
                                          "the lead stage the same experts, before their LoRAs")


def plan_stages(experts, schedule: RunSchedule, cfg: dict[str, float], lead_model=None) -> list[Stage]:
    """The run's stages in order: a lead stage, if the schedule has one (on `lead_model`, the MODEL the lead
    node was given), then the high-noise expert to the switch (leftover noise kept), then the low-noise expert
    to the end; a stage with no steps is left out, and a lone stage runs as one KSampler."""
    check_run(experts, schedule)
    if (schedule.lead is None) != (lead_model is None):
        raise RuntimeError("a lead stage runs on the MODEL its node was given, and only a lead stage has one")
    models = experts.models()
    names = list(schedule.stage_steps())
    stages = []
    for i, name in enumerate(names):
        first, last = i == 0, i == len(names) - 1
        if name == "lead":
            lead = schedule.lead
            stages.append(Stage(name="lead", role="high", model=shifted(lead_model, schedule.flow_shift),
                                cfg=float(lead.cfg), steps=lead.steps, start_step=0, last_step=lead.end_step,
                                sigmas=schedule.stage_sigmas("lead"), add_noise=True, full_denoise=last,
                                own_sigmas=not lead.exact))
            continue
        start, end = schedule.stage_bounds(name)
        stages.append(Stage(name=name, role=name, model=shifted(models[name], schedule.flow_shift),
                            cfg=float(cfg[name]), steps=schedule.steps, start_step=start, last_step=end,
                            sigmas=schedule.stage_sigmas(name), add_noise=first, full_denoise=last))
    return stages


def cache_role(experts, stage: Stage) -> str:
    """Whose settings of the Cache-DiT node a stage's cache takes: its expert's; a single transformer (TI2V-5B)
    has one role, the high-noise expert's settings, whichever input it came through."""
    return "high" if experts.task == SINGLE else stage.role


def run_stage(stage: Stage, sampler: str, scheduler: str, positive, negative, latent: dict, seed: int) -> dict:
    """One stage exactly as a KSamplerAdvanced runs it: ComfyUI's own common_ksampler, which computes the
    sigmas from the clone's model sampling (StageCalls checks they are the stage's). It takes no callback,
    so its progress bar and previews run once per stage, as on the template's KSamplerAdvanced. A lead stage
    whose last step is its own runs through ComfyUI's SamplerCustom on its sigmas, as SamplerCustomAdvanced
    would run them."""
    if stage.own_sigmas:
        import comfy.samplers
        import torch
        from comfy_extras.nodes_custom_sampler import SamplerCustom

        return SamplerCustom.execute(stage.model, stage.add_noise, seed, stage.cfg, positive, negative,
                                     comfy.samplers.sampler_object(sampler), torch.tensor(stage.sigmas),
                                     latent).args[0]
    return comfyui_nodes.common_ksampler(
        stage.model, seed, stage.steps, stage.cfg, sampler, scheduler, positive, negative, latent, denoise=1.0,
        disable_noise=not stage.add_noise, start_step=stage.start_step, last_step=stage.last_step,
        force_full_denoise=stage.full_denoise)[0]


def sample(experts, schedule: RunSchedule, positive, negative, latent: dict, seed: int,
           cfg: dict[str, float], attach=None, lead_model=None) -> tuple[dict, RunRecord]:
    """Runs the stages through ComfyUI's sampling in this process; returns the LATENT (a new dict) and what the
    run did. A run with a parallel plan goes to the plan's workers instead (`dispatch.run` chooses), and each
    worker runs this function on its share; `attach` (a worker's) adds its wrappers to each stage's clone;
    `lead_model`: the MODEL of the schedule's lead stage, if it has one."""
    if experts.parallel_plan is not None:
        raise RuntimeError("engine.sample runs in this process: a run with a parallel plan goes through "
                           "dispatch.run, which hands it to the plan's workers")
    stages = plan_stages(experts, schedule, cfg, lead_model)
    plan = experts.cache_plan
    record = RunRecord(stages=tuple(stage.name for stage in stages))
    compiled = {stage.name: kwargs["backend"] for stage in stages
                if (kwargs := stage.model.model_options.get("torch_compile_kwargs"))}
    graphs = dynamo_graphs()
    out = latent
    shares = cache_core.error_shares(record.stages)
    for stage in stages:
        calls = StageCalls(stage.name, stage.sigmas)
        calls.attach(stage.model)
        cache = (StageCache(plan, cache_role(experts, stage), stage.name, calls=calls, share=shares[stage.name])
                 if plan is not None else None)
        if cache is not None:
            cache.attach(stage.model)
        if attach is not None:
            attach(stage.model, stage.name)
        started = time.perf_counter()
        out = run_stage(stage, schedule.sampler, schedule.scheduler, positive, negative, out, seed)
        record.seconds[stage.name] = round(time.perf_counter() - started, 4)
        record.calls[stage.name], record.forward_passes[stage.name] = calls.calls, calls.prompts
        steps = len(stage.sigmas) - 1  # a sampler whose step callbacks do not mark its steps: one evaluation each
        per_step = calls.per_step if len(calls.per_step) == steps else [1] * steps
        record.steps += [StepRecord(index=len(record.steps) + i, sigma=stage.sigmas[i], expert=stage.role,
                                    evaluations=n, stage=stage.name) for i, n in enumerate(per_step)]
        if cache is not None:
            record.cache[stage.name] = cache.statistics(experts.architecture.num_layers)
    if plan is not None:
        record.cache_plan = StageCache.backend.describe_plan(plan)
    if compiled:
        record.compile = {"backend": compiled, "graphs_compiled": dynamo_graphs() - graphs}
    return out, record


def dynamo_graphs() -> int:
    """The graphs torch.compile has compiled in this process so far (dynamo's own count): a run that compiles
    none has reused what earlier runs compiled."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
