"""Cache-DiT per expert: the cache plan (a value the Cache-DiT node puts on a handle) and what one stage's
cache did, as the report gives it.

Each expert's stage of a run gets a context of its own, built when the stage starts and dropped when it ends,
so nothing a context learnt in one stage or run reaches another; what it did is counted as the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Wan22InputError
from .experts import ROLE_WORDS, ROLES

CALIBRATORS = ("none", "taylorseer")


@dataclass(frozen=True)
class ExpertCacheSettings:
    warmup_steps: int  # evaluations computed in full before caching may start
    max_cached_steps: int  # -1: no limit; 0: never cache on this expert
    residual_diff_threshold: float | None = None  # this expert's own (an error budget's calibration); None: the plan's


@dataclass(frozen=True)
class CachePlan:
    """What Cache-DiT should do on each expert: printable and comparable, applied in one place. The
    defaults: F1 B0 MC3; high W4 with no cap, low W2 M20 (Wan2.2's serving settings), and threshold 0.05, the
    largest that kept the trained test bed's median error at or below 0.03 at 20 and at 40 steps
    (bench/quality.py; the serving threshold 0.24 cost it 0.08 to 0.11)."""

    residual_diff_threshold: float = 0.05
    first_compute_blocks: int = 1
    last_compute_blocks: int = 0
    max_continuous_cached_steps: int = 3
    high: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=4, max_cached_steps=-1)
    low: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=2, max_cached_steps=20)
    calibrator: str = "none"
    error_budget: float | None = None  # the budget the per-expert thresholds were calibrated for, if any

    def settings(self, role: str) -> ExpertCacheSettings:
        return self.high if role == "high" else self.low

    def threshold(self, role: str) -> float:
        own = self.settings(role).residual_diff_threshold
        return self.residual_diff_threshold if own is None else own

    def node_inputs(self) -> dict:
        """The plan as the Cache-DiT node's inputs (`enabled` aside): where workflows and tests read the
        defaults from."""
        values = {"residual_diff_threshold": self.residual_diff_threshold,
                  "first_compute_blocks": self.first_compute_blocks, "last_compute_blocks": self.last_compute_blocks,
                  "max_continuous_cached_steps": self.max_continuous_cached_steps}
        for role in ROLES:
            values[f"{role}_warmup_steps"] = self.settings(role).warmup_steps
            values[f"{role}_max_cached_steps"] = self.settings(role).max_cached_steps
        values["calibrator"] = self.calibrator
        return values

    def check(self, num_layers: int) -> None:
        """Refuses a plan these experts cannot take, naming the Cache-DiT node's input."""
        if not self.residual_diff_threshold > 0:
            raise Wan22InputError("residual_diff_threshold", f"{self.residual_diff_threshold} must be greater "
                                                             "than 0 (0.05 is the default)")
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
            if s.residual_diff_threshold is not None and not s.residual_diff_threshold > 0:
                raise Wan22InputError("error_budget", f"the {ROLE_WORDS[role]} expert's calibrated threshold "
                                                      f"{s.residual_diff_threshold} must be greater than 0")
            if s.max_cached_steps < -1:
                raise Wan22InputError(f"{role}_max_cached_steps", f"{s.max_cached_steps}: use -1 for no limit, "
                                                                  "or 0 or more")
        if self.max_continuous_cached_steps < -1 or self.max_continuous_cached_steps == 0:
            raise Wan22InputError("max_continuous_cached_steps", f"{self.max_continuous_cached_steps}: use -1 for "
                                                                 "no limit, or 1 or more")
        if self.calibrator not in CALIBRATORS:
            raise Wan22InputError("calibrator", f"unknown calibrator {self.calibrator!r}: use one of "
                                                f"{', '.join(CALIBRATORS)}")


# --- what one stage's cache did ---

@dataclass(frozen=True)
class StageSeen:
    """What the stage observer saw of one cached stage."""

    evaluations: int  # the sampler's transformer evaluations of the expert in the stage
    calls: int  # transformer calls (two per evaluation when ComfyUI runs the prompts separately)
    cfg_batching: str | None  # single (CFG 1) | batched (all prompts in one call) | separate (one each)
    pass_order: tuple[str, ...]  # the prompts in the order ComfyUI ran them (separate: the cache's streams)
    block_forwards: int  # blocks really run
    config: str  # the cache's name for the stage's settings


def skippable_steps(plan: CachePlan, role: str, evaluations: int) -> int:
    """The most evaluations the cache can serve on one expert in a stage of `evaluations`: its warm-up is
    always computed, and `max_cached_steps` caps the rest. At 4-step LoRA runs this is usually 0."""
    s = plan.settings(role)
    could = max(0, evaluations - s.warmup_steps)
    return could if s.max_cached_steps < 0 else min(could, s.max_cached_steps)


def skip_note(plan: CachePlan, role: str, evaluations: int) -> str:
    """A plain sentence on what the cache can do for one expert in this run."""
    could, settings = skippable_steps(plan, role, evaluations), plan.settings(role)
    if could == 0 and settings.max_cached_steps == 0:
        return (f"run without the cache: {role}_max_cached_steps is 0, so none of the {ROLE_WORDS[role]} expert's "
                f"{evaluations} steps may be cached")
    if could == 0:
        return (f"cached nothing: it could skip none of the {ROLE_WORDS[role]} expert's {evaluations} steps, "
                f"as its first {settings.warmup_steps} are warm-up, computed in full (lower {role}_warmup_steps, or "
                "leave Cache-DiT off at so few steps)")
    return f"the cache can skip at most {could} of the {ROLE_WORDS[role]} expert's {evaluations} steps"


def statistics(plan: CachePlan, role: str, seen: StageSeen, outcome: dict, layers: int) -> dict:
    """One cached stage's entry in the report: what the cache did (`outcome`: the evaluations served from it,
    with separate calls cached_steps those of the first pass of each evaluation and cfg_cached_steps those of
    the second; the residual differences it compared with the threshold), the blocks really run against a run
    without cache, and how much the plan could skip at most."""
    return {
        "config": seen.config,
        "calibrator": plan.calibrator,
        "evaluations": seen.evaluations,
        "cfg_batching": seen.cfg_batching,
        "pass_order": list(seen.pass_order),
        "block_forwards": seen.block_forwards,
        "block_forwards_without_cache": seen.calls * layers,
        **outcome,
        "threshold": plan.threshold(role),
        "error_budget": plan.error_budget,
        "blocks_skipped_per_cached_forward": layers - plan.first_compute_blocks - plan.last_compute_blocks,
        "skippable_steps": skippable_steps(plan, role, seen.evaluations),
        "note": skip_note(plan, role, seen.evaluations),
    }
