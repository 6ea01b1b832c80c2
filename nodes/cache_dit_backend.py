"""The one module that talks to cache-dit: DBCache installed on ComfyUI's Wan diffusion model for one stage,
refreshed, removed, and asked what it did and what it holds.

StageCache (stage_cache.py) observes a stage and decides when each of these runs; it never touches cache-dit
itself. Another cache method is another module with these functions (a test drives StageCache with a double):

- `describe(plan, role)`: the method's name for one expert's settings, as the canvas shows it;
- `is_cached(diffusion_model)`: whether a cache of this method runs the model now;
- `install(diffusion_model, plan, role, separate_cfg)` and `refresh(...)` (the same with a fresh context);
- `remove(diffusion_model)`: the model afterwards is bit-identical to one never cached;
- `outcome(diffusion_model)`: what it did, `held(diffusion_model)`: the tensors it holds;
- `contexts(diffusion_model)`: the configs of the contexts it holds on the model (tests and workers read them);
- `weigh_statistic(diffusion_model, weight)`: for a worker whose shard of the sequence is longer or shorter
  than an equal share, its residual statistic weighed before the workers average it (the parallel plan);
- `decide_by(diffusion_model, choose, seen)`: each step decided with the threshold a criterion gives for
  it (the error criterion, core.cache.ErrorAllowance), which hears each decision and the residual change;
- `watch_forecasts(diffusion_model, heard)`: at each computed step, what the cache would have used for the
  step's cached blocks minus what they computed (the error criterion's miss, cache_miss.py).

Each stage gets a context of its own, built when the stage's sampling starts and dropped when it ends, so
cache-dit's step count (`num_inference_steps`, which only decides when a context it reuses restarts) stays
unset: a context sized with the stage's evaluations gave the same latents and the same cached steps bit for bit,
for every ComfyUI sampler, batched and separate CFG (measured on ComfyUI 0.30.0 with cache-dit 1.5.3).
"""

from __future__ import annotations

import logging
import re

from .core.cache import CachePlan
from .core.logs import at_level


def quiet():
    """cache-dit logs every enable/disable to its own console handler; the pack's report says it all."""
    import cache_dit.logger

    handler = getattr(cache_dit.logger, "_default_handler", None) or logging.NullHandler()
    return at_level(handler, logging.ERROR)


def config(plan: CachePlan, role: str, separate_cfg: bool | None, installed: bool = False):
    """cache-dit's config for one expert's context. With separate CFG, each evaluation is a pair of transformer
    calls, each prompt with a residual stream of its own; without, one call per evaluation (CFG 1, or both
    prompts batched in it). None leaves it open (the plan before a run decides it). `installed`: the config
    installed, where the error criterion keeps the caps itself (core.cache.ErrorAllowance): cache-dit does not
    compare a step a cap stops, and the criterion measures the miss of every step it compared."""
    from cache_dit import DBCacheConfig

    s = plan.settings(role)
    own_caps = installed and plan.criterion == "error"
    # A full config every time: a `.reset()` config cannot be a base config.
    return DBCacheConfig(Fn_compute_blocks=plan.first_compute_blocks, Bn_compute_blocks=plan.last_compute_blocks,
                         residual_diff_threshold=plan.residual_diff_threshold, max_warmup_steps=s.warmup_steps,
                         warmup_interval=1, max_cached_steps=-1 if own_caps else s.max_cached_steps,
                         max_continuous_cached_steps=-1 if own_caps else plan.max_continuous_cached_steps,
                         enable_separate_cfg=separate_cfg, cfg_compute_first=False)


def calibrator(plan: CachePlan):
    """cache-dit's calibrator config for the plan's calibrator (core.cache.CALIBRATORS), None for none."""
    if plan.calibrator == "none":
        return None
    from cache_dit.caching.cache_contexts.calibrators import (DMDCalibratorConfig, FoCaCalibratorConfig,
                                                              TaylorSeerCalibratorConfig)

    return {"taylorseer": lambda: TaylorSeerCalibratorConfig(taylorseer_order=1), "dmd": DMDCalibratorConfig,
            "foca": FoCaCalibratorConfig}[plan.calibrator]()


CALIBRATOR_TAGS = {"none": "", "taylorseer": "_T1", "dmd": "_DMDH6", "foca": "_FoCa"}  # cache-dit's own tags


def describe(plan: CachePlan, role: str, separate_cfg: bool | None = None) -> str:
    """cache-dit's name for one expert's settings; with `separate_cfg` None, without the CFG part that each
    stage decides when it runs (how ComfyUI batches the prompts; the sampler's report shows it). With the error
    criterion, its error target (E) stands where cache-dit prints the threshold (R), which it does not use."""
    name = config(plan, role, separate_cfg).strify()
    if plan.criterion == "error":
        name = re.sub(r"_R[0-9.e+-]+", f"_E{plan.error_target:g}", name)
    return name + CALIBRATOR_TAGS[plan.calibrator]


def describe_plan(plan: CachePlan) -> str:
    budget = "" if plan.error_budget is None else f" (error budget {plan.error_budget:g})"
    return f"high {describe(plan, 'high')}, low {describe(plan, 'low')}{budget}"


def is_cached(diffusion_model) -> bool:
    from cache_dit.caching.block_adapters import BlockAdapter

    return BlockAdapter.is_cached(diffusion_model)


def install(diffusion_model, plan: CachePlan, role: str, separate_cfg: bool) -> None:
    import cache_dit
    from cache_dit import BlockAdapter, ForwardPattern

    with quiet():
        # Pattern_3: ComfyUI's Wan blocks take x and return x (context, e, freqs as keyword arguments).
        adapter = BlockAdapter(transformer=diffusion_model, blocks=diffusion_model.blocks,
                               forward_pattern=ForwardPattern.Pattern_3, check_forward_pattern=False)
        cache_dit.enable_cache(adapter, cache_config=config(plan, role, separate_cfg, installed=True),
                               calibrator_config=calibrator(plan))


def refresh(diffusion_model, plan: CachePlan, role: str, separate_cfg: bool) -> None:
    """A new context of the given settings in place of the installed one. The blocks read their context by name
    on every call, so a refresh before a call's blocks run applies to that call."""
    import cache_dit

    with quiet():
        cache_dit.refresh_context(diffusion_model, cache_config=config(plan, role, separate_cfg, installed=True),
                                  calibrator_config=calibrator(plan))


def remove(diffusion_model) -> None:
    """Unhooks the model completely: its output is then bit-identical to a model never cached."""
    import cache_dit

    if is_cached(diffusion_model):
        with quiet():
            cache_dit.disable_cache(diffusion_model)
    # disable_cache leaves `forward` as an instance attribute bound to the class's own forward: drop it, so
    # the shared model is exactly as ComfyUI built it.
    forward = vars(diffusion_model).get("forward")
    if forward is not None and getattr(forward, "__func__", None) is type(diffusion_model).forward:
        del diffusion_model.forward


def _manager(diffusion_model):
    """cache-dit's private context registry on the model (the only place that reads it), or None."""
    return getattr(diffusion_model, "_context_manager", None)


def _contexts(diffusion_model) -> list:
    """cache-dit's contexts on the model."""
    manager = _manager(diffusion_model)
    if manager is None:
        return []
    return [manager.get_context(name) for name in getattr(diffusion_model, "_context_names", ())]


def _wrap_manager(diffusion_model, name: str, wrap):
    """cache-dit's method `name` on the model's manager replaced by `wrap(what it was)` until the returned function
    is called, which puts back exactly what it replaced (another wrapper installed before it included); nothing
    on a model that is not cached. Wrappers are taken off in the reverse order of their installing."""
    manager = _manager(diffusion_model)
    if manager is None or not is_cached(diffusion_model):
        return lambda: None
    had, before = name in vars(manager), vars(manager).get(name)
    wrapper = wrap(getattr(manager, name))
    setattr(manager, name, wrapper)

    def undo():
        if vars(manager).get(name) is wrapper:
            if had:
                setattr(manager, name, before)
            else:
                delattr(manager, name)
    return undo


def weigh_statistic(diffusion_model, weight: float):
    """Until the returned function is called, the model's cache weighs this worker's residual statistic by
    `weight` (core.parallel.statistic_weight): cache-dit averages each worker's mean difference and mean
    magnitude over the workers, which is the whole sequence's mean only for equal shards. Both means scale with
    the residuals, so the residuals it compares are scaled by the weight (their ratio, the statistic, is then
    the whole sequence's). Nothing is weighed on a model that is not cached."""
    def wrap(original):
        def similarity(t1, t2, **kwargs):
            return original(t1 * weight, t2 * weight, **kwargs)
        return similarity
    return _wrap_manager(diffusion_model, "similarity", wrap)


def decide_by(diffusion_model, choose, seen):
    """Until the returned function is called, each step of the model's cache is decided with `choose()`
    (read when cache-dit compares the step's first blocks' residual with the last computed step's) in place of
    its config's, and `seen(diff, cached)` hears the comparison (the relative L1 change, and whether the step
    is cached). A step cache-dit does not compare (warm-up, a cap reached) is not heard: it is computed.
    cache-dit's similarity records the change it compared and decides `diff < threshold`; a threshold of 0
    computes the step without comparing."""
    manager = _manager(diffusion_model)

    def wrap(original):
        def similarity(t1, t2, *, threshold, **kwargs):
            chosen = choose()
            cached = original(t1, t2, threshold=chosen, **kwargs)
            if chosen > 0:
                separate = manager.is_separate_cfg_step()
                diff = (manager.get_current_step_cfg_residual_diff() if separate
                        else manager.get_current_step_residual_diff())
                seen(float(diff or 0.0), bool(cached))
            return cached
        return similarity
    return _wrap_manager(diffusion_model, "similarity", wrap)


def watch_forecasts(diffusion_model, heard):
    """Until the returned function is called, `heard(delta)` hears at each computed step what the cache would have
    used for the step's cached blocks (their last computed residual, or the calibrator's forecast of it) minus
    what they computed, a tensor of the hidden state's shape (of this worker's shard); nothing at a step before
    the cache has a residual. It is read where cache-dit stores the computed residual, before it does."""
    import torch

    manager = _manager(diffusion_model)

    def calibrator():
        if not manager.is_calibrator_enabled():
            return None
        return (manager.get_cfg_calibrator() if manager.is_separate_cfg_step() else manager.get_calibrator())[0]

    def wrap(original):
        def set_Bn_buffer(buffer, prefix="Bn"):
            try:
                forecast = peek(calibrator(), lambda: manager.get_Bn_buffer(prefix))
            except (AssertionError, KeyError, RuntimeError):  # a calibrator with no state yet: nothing to forecast
                forecast = None
            if isinstance(forecast, torch.Tensor) and isinstance(buffer, torch.Tensor) \
                    and forecast.shape == buffer.shape:
                heard(forecast - buffer)
            return original(buffer, prefix=prefix)
        return set_Bn_buffer
    return _wrap_manager(diffusion_model, "set_Bn_buffer", wrap)


def peek(calibrator, read):
    """read() (a forecast) with the calibrator's per-stream states left as they were before it: FoCa's forecast
    advances its window (the forecast becomes its newest value), so a forecast read at a computed step, which
    cache-dit itself never makes, would change what FoCa forecasts next."""
    states = getattr(calibrator, "states", None) or {}
    kept = {name: dict(vars(state)) for name, state in states.items()}
    try:
        return read()
    finally:
        for name, values in kept.items():
            vars(states[name]).clear()
            vars(states[name]).update(values)


def contexts(diffusion_model) -> list[dict]:
    """Each context cache-dit holds on the model: {"separate_cfg", "steps", "executed"} (steps: cache-dit's
    num_inference_steps, None when unset; executed: the evaluations it has run so far)."""
    return [{"separate_cfg": c.cache_config.enable_separate_cfg, "steps": c.cache_config.num_inference_steps,
             "executed": c.accumulated_executed_steps} for c in _contexts(diffusion_model)]


def held(diffusion_model) -> dict:
    """What cache-dit's contexts on the model hold: the bytes of every tensor in their buffers (the cached
    residuals and hidden states) and calibrators (TaylorSeer's derivatives), each counted once, and the
    devices they are on."""
    import torch

    found = {}  # id -> tensor: each counted once

    def walk(value, depth=0):
        if isinstance(value, torch.Tensor):
            found[id(value)] = value
            return
        if depth > 12:
            return
        if hasattr(value, "__dict__") and type(value).__module__.startswith("cache_dit"):
            value = vars(value)
        if isinstance(value, dict):
            value = value.values()
        if isinstance(value, (list, tuple, type({}.values()))):
            for item in value:
                walk(item, depth + 1)
    for context in _contexts(diffusion_model):
        walk([context.buffers, context.calibrator, context.encoder_calibrator, context.cfg_calibrator,
              context.cfg_encoder_calibrator])
    tensors = found.values()
    return {"bytes": sum(t.numel() * t.element_size() for t in tensors),
            "devices": sorted({str(t.device) for t in tensors})}


def outcome(diffusion_model) -> dict:
    """cache-dit's own summary of the stage's context: the evaluations served from the cache (with separate
    calls, cached_steps are those of the first pass of each evaluation and cfg_cached_steps those of the
    second) and the residual differences it compared with the threshold."""
    import cache_dit

    summaries = [s for s in cache_dit.summary(diffusion_model, details=False, logging=False) if s.cache_options]
    summary = summaries[0] if summaries else None
    return {"cached_steps": sorted(int(s) for s in (summary.cached_steps if summary else [])),
            "cfg_cached_steps": sorted(int(s) for s in (summary.cfg_cached_steps if summary else [])),
            "residual_diffs": {str(k): round(float(v), 5)
                               for k, v in (summary.residual_diffs if summary else {}).items()}}


NOTHING = {"cached_steps": [], "cfg_cached_steps": [], "residual_diffs": {}}  # a stage that ran without the cache
