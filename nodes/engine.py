"""The glue to ComfyUI's own models and sampling.

- `run_sigmas`: the sigmas of a run, from ComfyUI's scheduler with the flow shift applied as
  ModelSamplingSD3 applies it: what the schedule node counts the split from.
- `experts_handle`: the WAN22_EXPERTS handle over ComfyUI MODELs, checked to be Wan2.2 A14B experts.
- `sample`: the two stages the official template's two KSamplerAdvanced run, through ComfyUI's own
  sampling (and model management, progress, previews, interrupt), each stage on a clone of its expert.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

import comfy.ldm.wan.model
import comfy.model_base
import comfy.model_sampling
import comfy.patcher_extension
import comfy.sample
import comfy.samplers
import comfy.utils
import latent_preview

from .core import cache as core_cache
from .core import experts as core_experts
from .core import schedule as core_schedule
from .core.architecture import ExpertArchitecture, check_matching, check_task, not_an_expert
from .core.errors import Wan22InputError
from .core.report import RunRecord, StepRecord
from .core.schedule import RunSchedule
from .stage_cache import StageCache, prompts_in, transformer_options

# --- sigmas ---


class _FlowSampling(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
    """The model sampling that ModelSamplingSD3 puts on a model (shift, multiplier 1000)."""


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
    by KSampler itself: its scheduler and its own rule for the samplers that drop the penultimate sigma."""
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


# --- experts: ComfyUI MODELs checked to be Wan2.2 A14B experts ---


def architecture_of(model, input_name: str) -> ExpertArchitecture:
    """The architecture of a MODEL, refused by input name when it is not a Wan2.2 A14B expert."""
    what = f"the MODEL given to {input_name}"
    base = getattr(model, "model", None)
    if not isinstance(base, comfy.model_base.WAN21) or not isinstance(getattr(base, "diffusion_model", None),
                                                                      comfy.ldm.wan.model.WanModel):
        kind = type(base).__name__ if base is not None else type(model).__name__
        raise Wan22InputError(input_name, f"{what} is not a Wan 2.x transformer (it is a {kind} model): connect "
                                          "the high-noise or low-noise expert of Wan2.2 A14B, e.g. from Load "
                                          "Diffusion Model")
    config = base.model_config.unet_config
    if config.get("model_type") not in ("t2v", "i2v"):
        raise not_an_expert(input_name, what, f"it is a Wan {config.get('model_type')} model")
    check_task(config["in_dim"], input_name, what)
    text = base.diffusion_model.text_embedding[0]
    return ExpertArchitecture(dim=config["dim"], num_layers=config["num_layers"], in_channels=config["in_dim"],
                              out_channels=config["out_dim"], ffn_dim=config["ffn_dim"],
                              text_dim=getattr(text, "in_features", None) or config.get("text_dim", 4096))


def source_name(model) -> str:
    """The file a MODEL was loaded from (ComfyUI's loader records it), else "MODEL"."""
    init = getattr(model, "cached_patcher_init", None)
    if init and len(init) > 1 and init[1] and isinstance(init[1][0], str):
        return os.path.basename(init[1][0])
    return "MODEL"


def experts_handle(models: dict, sources: dict[str, str] | None = None, declared_boundary: float | None = None,
                   empty: str = "'none'", fix: str = "load at least one expert") -> core_experts.Wan22Experts:
    """The handle over the given MODELs (role -> MODEL or None): each checked, the two checked to match."""
    core_experts.require_some_expert(models.get("high"), models.get("low"), empty=empty, fix=fix)
    loaded = {role: m for role, m in models.items() if m is not None}
    architectures = {role: architecture_of(m, core_experts.EXPERT_INPUTS[role]) for role, m in loaded.items()}
    sources = {role: (sources or {}).get(role) or source_name(m) for role, m in loaded.items()}
    check_matching(architectures, sources)
    architecture = next(iter(architectures.values()))
    return core_experts.Wan22Experts(
        high=models.get("high"), low=models.get("low"), architecture=architecture,
        sources=tuple(sources.get(role, core_experts.NONE) for role in core_experts.ROLES),
        default_boundary=core_experts.default_boundary(architecture, declared_boundary))


# --- sampling: the two stages of the official template's two KSamplerAdvanced ---


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


def plan_stages(experts, schedule: RunSchedule, cfg: dict[str, float]) -> list[Stage]:
    """High-noise expert from step 0 to the switch (leftover noise kept), then the low-noise expert to the
    end; an expert with no steps has no stage, and a lone stage runs as one KSampler."""
    check_run(experts, schedule)
    models = experts.models()
    bounds = {"high": (0, schedule.high_steps), "low": (schedule.high_steps, schedule.steps)}
    roles = [role for role in core_experts.ROLES if bounds[role][1] > bounds[role][0]]
    return [Stage(role=role, model=shifted(models[role], schedule.flow_shift), cfg=float(cfg[role]),
                  start_step=bounds[role][0], last_step=bounds[role][1], add_noise=i == 0,
                  full_denoise=i == len(roles) - 1) for i, role in enumerate(roles)]


def check_run(experts, schedule: RunSchedule) -> None:
    """The schedule must have been resolved for these experts (it pins the boundary by what is loaded)."""
    if (schedule.has_high, schedule.has_low, schedule.model_default) != (
            experts.has_high, experts.has_low, experts.default_boundary):
        raise Wan22InputError("schedule", "this schedule was built for other experts; connect the schedule "
                                          "node's experts input to the same experts as the sampler's")


class CallCounter:
    """Counts the transformer calls of a stage (and the cond/uncond passes batched into them) through a
    diffusion-model wrapper on the stage's own clone."""

    KEY = "wan22_call_counter"

    def __init__(self):
        self.calls = 0
        self.passes = 0

    def __call__(self, executor, *args, **kwargs):
        self.calls += 1
        self.passes += prompts_in(transformer_options(args, kwargs))
        return executor(*args, **kwargs)

    def attach(self, model) -> None:
        model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, self.KEY, self)


def stage_caches(experts, schedule: RunSchedule, stages: list[Stage]) -> dict:
    """The Cache-DiT of each stage (role -> StageCache), each sized with that stage's own evaluations; all
    checked before anything runs."""
    plan = experts.cache_plan
    if plan is None:
        return {}
    caches = {}
    for stage in stages:
        per_step = core_cache.evaluations_per_step(schedule.sampler, schedule.stage_sigmas(stage.role))
        uncond = core_cache.needs_uncond(stage.cfg, schedule.sampler)
        caches[stage.role] = StageCache(plan, stage.role, per_step, uncond)
    return caches


def sample(experts, schedule: RunSchedule, positive, negative, latent: dict, seed: int,
           cfg: dict[str, float]) -> tuple[dict, RunRecord]:
    """Runs the stages through ComfyUI's sampling; returns the LATENT (a new dict) and what the run did."""
    stages = plan_stages(experts, schedule, cfg)
    caches = stage_caches(experts, schedule, stages)
    sigmas = torch.tensor(schedule.sigmas, dtype=torch.float32)
    record = RunRecord(split=schedule.split)
    progress = comfy.utils.ProgressBar(schedule.steps)
    out = latent
    for stage in stages:
        counter = CallCounter()
        counter.attach(stage.model)
        cache = caches.get(stage.role)
        if cache is not None:
            cache.attach(stage.model)
        started = time.perf_counter()
        out = sample_stage(stage, sigmas, schedule, positive, negative, out, seed, progress)
        record.seconds[stage.role] = round(time.perf_counter() - started, 4)
        record.calls[stage.role], record.passes[stage.role] = counter.calls, counter.passes
        per_step = cache.per_step if cache is not None else [1] * stage.steps
        record.steps += [StepRecord(index=stage.start_step + i, sigma=schedule.sigmas[stage.start_step + i],
                                    expert=stage.role, evaluations=n) for i, n in enumerate(per_step)]
        if cache is not None:
            record.cache[stage.role] = core_cache.statistics(
                experts.cache_plan, stage.role, cache.summary, cache.config.strify(), cache.evaluations, cache.passes,
                counter.calls, cache.block_forwards, experts.architecture.num_layers)
    return out, record


def sample_stage(stage: Stage, sigmas: torch.Tensor, schedule: RunSchedule, positive, negative, latent: dict,
                 seed: int, progress) -> dict:
    """One stage, as `nodes.common_ksampler` runs a KSamplerAdvanced, stepping through the schedule's own
    sigmas, with one progress bar (and ComfyUI's previews) over the whole run."""
    model = stage.model
    latent_image = comfy.sample.fix_empty_latent_channels(model, latent["samples"],
                                                          latent.get("downscale_ratio_spacial", None),
                                                          latent.get("downscale_ratio_temporal", None))
    if stage.add_noise:
        noise = comfy.sample.prepare_noise(latent_image, seed, latent.get("batch_index"))
    else:
        noise = torch.zeros(latent_image.size(), dtype=latent_image.dtype, layout=latent_image.layout, device="cpu")
    previewer = latent_preview.get_previewer(model.load_device, model.model.latent_format)

    def callback(step, x0, x, total_steps):
        # An adaptive sampler reports more steps than it was given: the bar stops at the stage's end.
        done = min(stage.start_step + step + 1, stage.last_step)
        preview = previewer.decode_latent_to_preview_image("JPEG", x0) if previewer else None
        progress.update_absolute(done, schedule.steps, preview)

    samples = comfy.sample.sample(
        model, noise, schedule.steps, stage.cfg, schedule.sampler, schedule.scheduler, positive, negative,
        latent_image, denoise=1.0, disable_noise=not stage.add_noise, start_step=stage.start_step,
        last_step=stage.last_step, force_full_denoise=stage.full_denoise, noise_mask=latent.get("noise_mask"),
        sigmas=sigmas.clone(), callback=callback, disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=seed)
    out = latent.copy()  # the input dict is shared with other consumers
    out.pop("downscale_ratio_spacial", None)
    out.pop("downscale_ratio_temporal", None)
    out["samples"] = samples
    return out
