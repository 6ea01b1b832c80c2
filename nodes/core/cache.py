"""Cache-DiT on the two experts: the cache plan (a value), and the lifecycle the sampler runs before
every run: reconcile what is installed with the handle's plan, then refresh each expert's context
with that expert's share of this run's steps. Traps are in shared/reference/cache-dit.md; each one
this module avoids is marked where it does.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch

from .errors import Wan22InputError
from .logs import quiet_cache_dit

ROLES = ("high", "low")


@dataclass(frozen=True)
class ExpertCacheSettings:
    warmup_steps: int  # steps computed in full before caching may start
    max_cached_steps: int  # -1: no limit; 0: never cache on this expert


@dataclass(frozen=True)
class CachePlan:
    """What Cache-DiT should do on each expert: printable and comparable, applied in one place."""

    residual_diff_threshold: float = 0.24
    first_compute_blocks: int = 1
    last_compute_blocks: int = 0
    max_continuous_cached_steps: int = 3
    high: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=4, max_cached_steps=-1)
    low: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=2, max_cached_steps=20)

    def settings(self, role: str) -> ExpertCacheSettings:
        return self.high if role == "high" else self.low

    def check(self, num_layers: int) -> None:
        """Refuses a plan these experts cannot take, naming the Cache-DiT node's input."""
        if not self.residual_diff_threshold > 0:
            raise Wan22InputError("residual_diff_threshold", f"{self.residual_diff_threshold} must be greater "
                                                             "than 0 (0.24 is the Wan2.2 setting)")
        if self.first_compute_blocks < 1:
            raise Wan22InputError("first_compute_blocks", "must be at least 1: the first block's residual is "
                                                          "what decides whether a step is cached")
        if self.last_compute_blocks < 0:
            raise Wan22InputError("last_compute_blocks", f"{self.last_compute_blocks} must be 0 or more")
        if self.first_compute_blocks + self.last_compute_blocks >= num_layers:
            raise Wan22InputError("first_compute_blocks", f"first + last compute blocks "
                                  f"({self.first_compute_blocks} + {self.last_compute_blocks}) must leave blocks to "
                                  f"cache; these experts have {num_layers} layers")
        for role in ROLES:
            s = self.settings(role)
            if s.warmup_steps < 0:
                raise Wan22InputError(f"{role}_warmup_steps", f"{s.warmup_steps} must be 0 or more")
            if s.max_cached_steps < -1:
                raise Wan22InputError(f"{role}_max_cached_steps", f"{s.max_cached_steps}: use -1 for no limit, "
                                                                  "or 0 or more")
        if self.max_continuous_cached_steps < -1 or self.max_continuous_cached_steps == 0:
            raise Wan22InputError("max_continuous_cached_steps", f"{self.max_continuous_cached_steps}: use -1 for "
                                                                 "no limit, or 1 or more")

    def db_cache_config(self, role: str, num_steps: int | None, separate_cfg: bool):
        from cache_dit import DBCacheConfig

        s = self.settings(role)
        # A full config every time: a `.reset()` config cannot be a base config, and a refresh merges
        # fields (it cannot set one back to None), so every field is given explicitly.
        return DBCacheConfig(Fn_compute_blocks=self.first_compute_blocks, Bn_compute_blocks=self.last_compute_blocks,
                             residual_diff_threshold=self.residual_diff_threshold, max_warmup_steps=s.warmup_steps,
                             warmup_interval=1, max_cached_steps=s.max_cached_steps,
                             max_continuous_cached_steps=self.max_continuous_cached_steps,
                             enable_separate_cfg=separate_cfg, num_inference_steps=num_steps)

    def strify(self, role: str) -> str:
        return self.db_cache_config(role, None, True).strify()

    def summary(self) -> str:
        return f"high {self.strify('high')}, low {self.strify('low')}"


# --- the installed state: lives on the expert modules; this table only remembers which plan put it there ---

_INSTALLED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[CachePlan, str]]" = weakref.WeakKeyDictionary()
# What cache-dit sets on a bare module; all of it must be gone after removal.
CACHE_DIT_ATTRIBUTES = ("_original_forward", "_context_manager", "_context_names", "_is_cached",
                        "_forward_pattern", "_has_separate_cfg", "_context_kwargs", "forward")


def is_cached(module: torch.nn.Module) -> bool:
    from cache_dit.caching.block_adapters import BlockAdapter

    return bool(BlockAdapter.is_cached(module))


def install(module: torch.nn.Module, plan: CachePlan, role: str) -> None:
    """Cache-DiT on one expert as a bare module with its own context manager: no pipeline class is
    patched (pipeline-level enabling patches WanPipeline for the whole process and crashes without a
    high-noise expert)."""
    import cache_dit

    with quiet_cache_dit():
        cache_dit.enable_cache(module, cache_config=plan.db_cache_config(role, None, True))
    _INSTALLED[module] = (plan, role)


def remove(module: torch.nn.Module) -> None:
    """Unhooks one expert completely: the output is then bit-identical to a never-cached module."""
    import cache_dit

    if is_cached(module):
        with quiet_cache_dit():
            cache_dit.disable_cache(module)
    # disable_cache restores forward as an instance attribute bound to the class's own forward: drop it
    # so the module is exactly as it was loaded.
    forward = vars(module).get("forward")
    if forward is not None and getattr(forward, "__func__", None) is type(module).forward:
        del module.forward
    _INSTALLED.pop(module, None)


def leftovers(module: torch.nn.Module) -> list[str]:
    """Any trace of cache-dit on a module and its sub-modules (empty when removal was clean)."""
    found = [f"{name or '<expert>'}.{attr}" for name, sub in module.named_modules() for attr in CACHE_DIT_ATTRIBUTES
             if attr in vars(sub)]
    found += [f"{name}:hooks" for name, sub in module.named_modules() if sub._forward_hooks or sub._forward_pre_hooks]
    if module in _INSTALLED:
        found.append("<registry>")
    return found


def loaded_targets(experts) -> dict[str, torch.nn.Module]:
    """The cache targets: the experts that are actually loaded."""
    return {role: module for role, module in (("high", experts.high_noise), ("low", experts.low_noise))
            if module is not None}


def reconcile(experts) -> None:
    """Makes what is installed on each loaded expert match the handle's plan (install, re-install, remove)."""
    plan = experts.cache_plan
    for role, module in loaded_targets(experts).items():
        if plan is None:
            if is_cached(module) or module in _INSTALLED:
                remove(module)
        elif _INSTALLED.get(module) != (plan, role) or not is_cached(module):
            remove(module)
            install(module, plan, role)


def refresh(experts, split: tuple[int, int], cfg_scales: dict[str, float]) -> dict[str, str]:
    """Sizes each cached expert's context with its steps in this run; returns the config strings.

    Refreshing before every run (also after a cancelled one) is what keeps runs repeatable: without
    it the automatic reset fires one call late and the next run starts from the last run's residual.
    An expert with no steps in this run is neither refreshed nor run.
    """
    import cache_dit

    plan = experts.cache_plan
    configs = {}
    if plan is None:
        return configs
    steps = dict(zip(ROLES, split))
    for role, module in loaded_targets(experts).items():
        if steps[role] == 0:
            continue
        # Separate CFG only when this expert really runs a negative pass: otherwise warm-up lasts twice
        # as long and the statistics never close.
        config = plan.db_cache_config(role, steps[role], separate_cfg=cfg_scales[role] != 1.0)
        with quiet_cache_dit():
            cache_dit.refresh_context(module, cache_config=config)
        configs[role] = config.strify()
    return configs


def context_sizes(module: torch.nn.Module) -> list[int | None]:
    """The step counts of the contexts cache-dit holds on a module, read from cache-dit itself."""
    manager = getattr(module, "_context_manager", None)
    if manager is None:
        return []
    return [manager.get_context(name).cache_config.num_inference_steps for name in module._context_names]


@dataclass
class BlockCounter:
    """Counts transformer block calls per expert during a run (hooks removed when it ends)."""

    counts: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ROLES})

    @contextlib.contextmanager
    def counting(self, experts):
        handles = []
        for role, module in loaded_targets(experts).items():
            def hook(_module, _args, _output, role=role):
                self.counts[role] += 1
            handles += [block.register_forward_hook(hook) for block in module.blocks]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def skippable_steps(plan: CachePlan, role: str, steps: int) -> int:
    """The most steps the cache can serve on one expert in a run of `steps` steps: its warm-up steps
    are always computed, and `max_cached_steps` caps the rest. At 4-step LoRA runs this is usually 0."""
    s = plan.settings(role)
    could = max(0, steps - s.warmup_steps)
    return could if s.max_cached_steps < 0 else min(could, s.max_cached_steps)


def skip_note(plan: CachePlan, role: str, steps: int) -> str:
    """A plain sentence on what the cache can do for one expert in this run."""
    could, warm = skippable_steps(plan, role, steps), plan.settings(role).warmup_steps
    if could == 0:
        return (f"the cache can skip none of the {role}-noise expert's {steps} steps: its first {warm} are warm-up, "
                f"computed in full (lower {role}_warmup_steps, or leave Cache-DiT off at so few steps)")
    return f"the cache can skip at most {could} of the {role}-noise expert's {steps} steps"


def statistics(experts, configs: dict[str, str], forwards: dict[str, int], block_calls: dict[str, int],
               split: tuple[int, int]) -> dict:
    """Per loaded expert: block forwards against a run without cache and, where it was cached in this
    run, cache-dit's own summary (cached steps per pass, residual differences against the threshold)
    and how many steps the plan could skip at most."""
    import cache_dit

    plan = experts.cache_plan
    steps = dict(zip(ROLES, split))
    stats = {}
    for role, module in loaded_targets(experts).items():
        layers = len(module.blocks)
        entry = {"block_forwards": block_calls[role], "block_forwards_without_cache": forwards[role] * layers}
        if role in configs:
            summaries = [s for s in cache_dit.summary(module, details=False, logging=False) if s.cache_options]
            summary = summaries[0] if summaries else None
            entry.update({
                "config": configs[role],
                "context_steps": context_sizes(module),
                "cached_steps": sorted(int(s) for s in (summary.cached_steps if summary else [])),
                "cfg_cached_steps": sorted(int(s) for s in (summary.cfg_cached_steps if summary else [])),
                "residual_diffs": {str(k): round(float(v), 5)
                                   for k, v in (summary.residual_diffs if summary else {}).items()},
                "threshold": plan.residual_diff_threshold,
                "blocks_skipped_per_cached_forward": layers - plan.first_compute_blocks - plan.last_compute_blocks,
                "skippable_steps": skippable_steps(plan, role, steps[role]),
                "note": skip_note(plan, role, steps[role]),
            })
        stats[role] = entry
    return stats
