"""Cache-DiT per expert: the cache plan (a value the Cache-DiT node puts on a handle), the error criterion that
decides each step from the run's own statistics, and what one stage's cache did, as the report gives it.

Each expert's stage of a run gets a context of its own, built when the stage starts and dropped when it ends,
so nothing a context learnt in one stage or run reaches another; what it did is counted as the stage runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import Wan22InputError
from .experts import ROLE_WORDS, ROLES

# What a cached step is given for its cached blocks: the last computed residual ("none"), or cache-dit's forecast
# of it from the computed ones: TaylorSeer (first-order polynomial from the last anchor), DMD (an exponential fit
# to the last 6 computed residuals: dynamic mode decomposition, Prony's method; Taylor until it has 4) or FoCa
# (a BDF2 predictor with a Heun corrector, recursive over cached steps). Added after workflows were saved: new
# names only, at the end.
CALIBRATORS = ("none", "taylorseer", "dmd", "foca")
# The tensors of the hidden state's size a context holds per prompt stream at most, by calibrator, at F1 B0 (the
# first blocks' output it compares and the residual it reuses, then the calibrator's states): measured on fp32
# experts (tests/in_comfyui/test_cache_nodes.py). DMD keeps its fit in complex128 whatever the experts' dtype, so
# on bf16 experts its share is larger still.
HELD_PER_STREAM = {"none": 2, "taylorseer": 5, "dmd": 23, "foca": 5}


def held_tensors(calibrator: str, vace: bool = False) -> int:
    """The hidden-state-sized tensors a stage's cache holds per prompt stream: cache-dit's (HELD_PER_STREAM), and
    with VACE's fresh hints the sum of the skipped blocks' hints (one more)."""
    return HELD_PER_STREAM[calibrator] + (1 if vace else 0)


def cache_bytes(*, tokens: int, width: int, itemsize: int, streams: int, batch: int, calibrator: str,
                vace: bool = False, prompt_degree: int = 1, sequence_degree: int = 1) -> int:
    """The bytes a stage's cache will hold, known before it samples: held_tensors of the hidden state's size
    (`batch` latents x `tokens` x the model's `width`, at `itemsize` bytes) for each of `streams` prompt streams.
    A worker of a parallel plan holds its share: its prompts (of `prompt_degree` groups) and its shard of the
    sequence (of `sequence_degree`), the larger one where they do not divide."""
    streams, tokens = -(-streams // prompt_degree), -(-tokens // sequence_degree)
    return held_tensors(calibrator, vace) * streams * batch * tokens * width * itemsize


# How a step is chosen for the cache:
# - "error": each cached step's change to the final latent is estimated from what the run itself measures (the
#   cache's miss at its computed steps, through the model's own output and CFG, per unit of the first blocks'
#   residual change; the sampler's sigma gap), and steps are cached while the estimates of the cached ones fit
#   the run's error target; nothing in it is fitted on a model, so a target means its number on any model, sampler,
#   step count and shift;
# - "threshold": cache-dit's own rule, a step is cached while that residual change is below a fixed threshold
#   (what workflows saved before the error criterion keep).
CRITERIA = ("error", "threshold")
SAVED_CRITERION = "threshold"  # what a Cache-DiT node saved without a criterion runs with


@dataclass(frozen=True)
class ExpertCacheSettings:
    warmup_steps: int  # evaluations computed in full before caching may start
    max_cached_steps: int  # -1: no limit; 0: never cache on this expert


@dataclass(frozen=True)
class CachePlan:
    """What Cache-DiT should do on each expert: printable and comparable, applied in one place. The
    defaults: F1 B0 MC3, high with no cap, low M20 (Wan2.2's serving settings), the error criterion with a
    warm-up of 1 on each expert and the error target chosen on the tuning bed (bench/quality/judge.py `choose`: the
    error criterion weighs early steps itself, so it needs only one computed step to compare with). The
    threshold applies to the "threshold" criterion only (0.05, the largest that kept the tuning bed's median error
    at or below 0.03 at 20 and at 40 steps; other models need other thresholds, which is why it is no longer the
    default; saved workflows keep their warm-ups, 4 and 2, with it)."""

    residual_diff_threshold: float = 0.05
    first_compute_blocks: int = 1
    last_compute_blocks: int = 0
    max_continuous_cached_steps: int = 3
    high: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=1, max_cached_steps=-1)
    low: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=1, max_cached_steps=20)
    calibrator: str = "none"
    error_budget: float | None = None  # the budget the error target was calibrated for, if any
    criterion: str = "error"
    error_target: float = 0.02  # the error criterion's allowance: the run's final latent, relative L2

    def settings(self, role: str) -> ExpertCacheSettings:
        return self.high if role == "high" else self.low

    def with_error_target(self, target: float, budget: float | None = None,
                          calibrator: str | None = None) -> "CachePlan":
        """The plan with the error criterion at `target` (an error budget's calibration, `budget`), and
        `calibrator` where given."""
        return replace(self, criterion="error", error_target=float(target), error_budget=budget,
                       calibrator=self.calibrator if calibrator is None else calibrator)

    def caches(self, role: str) -> bool:
        """Whether a stage of this expert may cache at all (a cap of 0, or an error target of 0: not)."""
        return self.settings(role).max_cached_steps != 0 and not (self.criterion == "error" and
                                                                  self.error_target == 0)

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
        values["criterion"] = self.criterion
        values["error_target"] = self.error_target
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
            if s.max_cached_steps < -1:
                raise Wan22InputError(f"{role}_max_cached_steps", f"{s.max_cached_steps}: use -1 for no limit, "
                                                                  "or 0 or more")
        if self.max_continuous_cached_steps < -1 or self.max_continuous_cached_steps == 0:
            raise Wan22InputError("max_continuous_cached_steps", f"{self.max_continuous_cached_steps}: use -1 for "
                                                                 "no limit, or 1 or more")
        if self.criterion not in CRITERIA:
            raise Wan22InputError("criterion", f"unknown criterion {self.criterion!r}: use one of "
                                               f"{', '.join(CRITERIA)}")
        if not (math.isfinite(self.error_target) and 0 <= self.error_target <= 1):
            raise Wan22InputError("error_target", f"{self.error_target} must be between 0 (cache nothing) and 1 (a "
                                                  "relative L2 of the final latent; "
                                                  f"{CachePlan.error_target} is the default)")
        if self.calibrator not in CALIBRATORS:
            raise Wan22InputError("calibrator", f"unknown calibrator {self.calibrator!r}: use one of "
                                                f"{', '.join(CALIBRATORS)}")


# --- the error criterion: each step decided from the run's own statistics ---

def sigma_gap(sigma: float, sigmas: tuple[float, ...]) -> float:
    """How far the sampler moves from an evaluation at `sigma` in a sampling over `sigmas` (descending, ending
    at the stage's last sigma): to the next sigma of the list below it. An evaluation between two sigmas (a
    second-order sampler's) belongs to the step that contains it; past the list's end, to 0."""
    below = [s for s in sigmas if s < sigma - 1e-9]
    return sigma - (max(below) if below else 0.0)


# How much a step's error grows by the end of the run, as a share of the run's own prediction of its final latent:
# the one factor of the estimate not measured in the run. Below the band an error is carried about as a share of
# that prediction; at high noise, where a model settles what it makes, it grows, to PROPAGATION["high"] above the
# band. The tuning bed's single steps (each step cached alone: its error over gap x miss) measure it; a run of
# cached steps measured RUN_OVER_SINGLE times their single-step estimate on the tuning beds (docs/quality.md, the
# criterion). bench/quality/judge.py `choose` computes the single-step medians from the tuning bed's results and
# tests/in_comfyui/test_quality_choice.py holds the pack to them.
SINGLE_STEP_PROPAGATION = {"low": 1.37, "high": 5.68}  # medians below and above the band, the tuning bed's
RUN_OVER_SINGLE = 1.5
PROPAGATION = {k: RUN_OVER_SINGLE * v for k, v in SINGLE_STEP_PROPAGATION.items()}
PROPAGATION_BAND = (0.85, 0.92)  # the sigmas over which it rises


def propagation(sigma: float) -> float:
    rise = min(max((float(sigma) - PROPAGATION_BAND[0]) / (PROPAGATION_BAND[1] - PROPAGATION_BAND[0]), 0.0), 1.0)
    return PROPAGATION["low"] + (PROPAGATION["high"] - PROPAGATION["low"]) * rise

COMPARE = 1e-12  # the threshold of a step that must be compared but not cached (cache-dit skips comparing at 0)


class ErrorAllowance:
    """One stage's share of the run's error target, spent by the steps it caches, estimated from what this run
    measures:

    - at each computed step the stage hears the cache's miss (`missed`, cache_miss.py): what the cache would have
      given for the step (its last computed residual, or its calibrator's forecast) against what the blocks
      computed, through the model's own output head and the run's CFG, as a share of the run's prediction of its
      final latent (the step's denoised latent), in the LATENT's space. Over the first blocks' residual change at
      that step (`diff`, what cache-dit compares), it is this model's miss per unit of change here, `rho`;
    - a cached step whose first blocks' residual changed by `diff` then misses the model's output by rho x diff,
      and the sampler moves the latent by its sigma gap on that output: its error is propagation(sigma) x gap x
      rho x diff of the final latent;
    - the computed step that ends a run of cached steps measures the miss the run grew to, and the run is
      estimated again with it: the estimate is corrected as the stage goes;
    - within a run of cached steps that reuse one residual, the steps' errors lag the same trajectory and add up;
      a forecasting calibrator's steps (`forecast`) each miss anew, and add in quadrature; separate runs, parted
      by computed steps, add in quadrature (each run cached alone, then all together: the whole measured the
      root of the sum of squares on the tuning bed, docs/quality.md).

    A step is cached while the estimate with it still fits the allowance, so the threshold on `diff` for a call is
    what is left of it over propagation x gap x rho. Until a miss has been measured (the stage's first compared
    step) nothing is cached."""

    def __init__(self, allowance: float, max_run: int = -1, max_cached: int = -1, forecast: bool = False):
        self.allowance = float(allowance)
        # the plan's caps (-1: none), kept here: cache-dit compares no step they stop (backend.config)
        self.max_run, self.max_cached = max_run, max_cached
        self.forecast = forecast  # a calibrator forecasts the cached steps: they add in quadrature in a run too
        self.in_run = 0.0  # the evaluations cached in the run in progress
        self.cached_total = 0.0  # ... in the stage
        self.closed = 0.0  # the estimate of the runs of cached steps that a computed step ended (quadrature)
        self.run_steps = 0.0  # the run in progress: share x gap x diff of its steps, summed (or squared, summed)
        self.run_rho = None  # the rho the run in progress is estimated with
        self.rho = None  # the last measured miss per unit of residual change
        self.misses = []  # every measured rho, in order (the report's)
        self.gap = 0.0  # the call in progress: its sigma gap, with the propagation at its sigma
        self.cached = False  # whether the last call heard was cached
        self.smallest = None  # the smallest change one step heard was estimated to make, cached or not

    @property
    def run(self) -> float:
        """The run in progress's estimate, rho apart."""
        return math.sqrt(self.run_steps) if self.forecast else self.run_steps

    @property
    def spent(self) -> float:
        return math.hypot(self.closed, self.run * (self.run_rho or 0.0))

    def at(self, sigma: float, sigmas: tuple[float, ...]) -> None:
        """The call about to run: an evaluation at `sigma` of a sampling over `sigmas`. A call before it that
        was not cached (computed, or in warm-up) ended the run of cached steps."""
        if not self.cached and self.in_run > 0:
            self.closed = math.hypot(self.closed, self.run * self.run_rho)
            self.run_steps, self.run_rho, self.in_run = 0.0, None, 0.0
        self.cached = False
        self.gap = propagation(sigma) * sigma_gap(sigma, sigmas)

    def threshold(self) -> float:
        """The residual change below which the call in progress may be cached (COMPARE: compared, not cached)."""
        if self.rho is None or self.gap <= 0 or 0 <= self.max_run <= self.in_run \
                or 0 <= self.max_cached <= self.cached_total:
            return COMPARE
        left = self.allowance ** 2 - self.closed ** 2  # what the run in progress may grow to, squared
        if left <= 0:
            return COMPARE
        rho = self.run_rho or self.rho  # the run's estimate with this step: run_rho x (run with gap x diff)
        room = (math.sqrt(max(left / rho ** 2 - self.run_steps, 0.0)) if self.forecast else
                math.sqrt(left) / rho - self.run_steps)
        return max(COMPARE, min(0.99, room * rho / (self.gap * self.rho)))  # cache-dit: >= 1 always

    def seen(self, diff: float, cached: bool, share: float = 1.0) -> None:
        """A call's outcome: `share` of an evaluation (1/2 for one of the two prompts' calls of separate CFG)."""
        if diff > 0 and self.rho is not None:
            step = self.gap * self.rho * diff
            self.smallest = step if self.smallest is None else min(self.smallest, step)
        if cached:
            self.cached = True
            if self.in_run == 0:
                self.run_rho = self.rho
            step = self.gap * max(diff, 0.0)  # a share of an evaluation (separate CFG's call) counts its share
            self.run_steps += share * (step ** 2 if self.forecast else step)
            self.in_run += share
            self.cached_total += share

    def missed(self, miss: float, diff: float) -> None:
        """A computed evaluation's miss, as a share of the latent's norm, and the first blocks' residual change
        cache-dit compared for it."""
        if not (diff > 0 and math.isfinite(miss)):
            return
        rho = miss / diff
        self.misses.append(rho)
        if self.in_run > 0 and not self.cached:  # the run this step ends grew to its miss: estimated again with it
            self.run_rho = rho
        self.rho = rho

    def estimate(self) -> dict:
        return {"error_target_share": round(self.allowance, 6), "estimated_error": round(self.spent, 6),
                "smallest_step_estimate": None if self.smallest is None else round(self.smallest, 6),
                "miss_per_change": [round(r, 5) for r in self.misses]}


def error_shares(stages: tuple[str, ...]) -> dict[str, float]:
    """Each stage's share of the run's error target, as stages' errors add (in quadrature, as ErrorAllowance adds
    its runs: the squares of the shares add up to 1): the experts share it equally, a lead stage sharing the
    high-noise expert's part equally with its main stage; a run on one expert gives it all."""
    experts = {"high" if stage == "lead" else stage for stage in stages}
    per_expert = 1.0 / len(experts)
    return {stage: math.sqrt(per_expert / (2 if "lead" in stages and stage in ("lead", "high") else 1))
            for stage in stages}


# the Cache-DiT MODEL node's stage: one expert's, the other carrying its own node
MODEL_SHARE = error_shares(("high", "low"))["high"]


def combined(estimates) -> float:
    """The run's estimated error from its stages' (they add in quadrature)."""
    return math.sqrt(sum(e * e for e in estimates))


def stage_allowance(plan: CachePlan, role: str, share: float) -> ErrorAllowance:
    """A stage's allowance: its share of the plan's error target, with the plan's caps for the expert."""
    return ErrorAllowance(plan.error_target * share, plan.max_continuous_cached_steps,
                          plan.settings(role).max_cached_steps, forecast=plan.calibrator != "none")


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
    if plan.criterion == "error" and plan.error_target == 0:
        return f"run without the cache: the error target is 0, so none of the {ROLE_WORDS[role]} expert's steps " \
               "may be cached"
    if could == 0 and settings.max_cached_steps == 0:
        return (f"run without the cache: {role}_max_cached_steps is 0, so none of the {ROLE_WORDS[role]} expert's "
                f"{evaluations} steps may be cached")
    if could == 0:
        return (f"cached nothing: it could skip none of the {ROLE_WORDS[role]} expert's {evaluations} steps, "
                f"as its first {settings.warmup_steps} are warm-up, computed in full (lower {role}_warmup_steps, or "
                "leave Cache-DiT off at so few steps)")
    return f"the cache can skip at most {could} of the {ROLE_WORDS[role]} expert's {evaluations} steps"


def uncached_block_forwards(calls: int, layers: int) -> int:
    """The block forwards of `calls` transformer calls without the cache: every block of every call."""
    return calls * layers


def statistics(plan: CachePlan, role: str, seen: StageSeen, outcome: dict, layers: int,
               estimate: dict | None = None) -> dict:
    """One cached stage's entry in the report: what the cache did (`outcome`: the evaluations served from it,
    with separate calls cached_steps those of the first pass of each evaluation and cfg_cached_steps those of
    the second; the residual differences it compared with the threshold), the blocks really run against a run
    without cache, how much the plan could skip at most, and with the error criterion its share of the error
    target and what the cached steps were estimated to cost (`estimate`: ErrorAllowance.estimate)."""
    return {
        "criterion": plan.criterion,
        **(estimate or {}),
        "config": seen.config,
        "calibrator": plan.calibrator,
        "evaluations": seen.evaluations,
        "cfg_batching": seen.cfg_batching,
        "pass_order": list(seen.pass_order),
        "block_forwards": seen.block_forwards,
        "block_forwards_without_cache": uncached_block_forwards(seen.calls, layers),
        **outcome,
        "threshold": plan.residual_diff_threshold if plan.criterion == "threshold" else None,
        "error_budget": plan.error_budget,
        "blocks_skipped_per_cached_forward": layers - plan.first_compute_blocks - plan.last_compute_blocks,
        "skippable_steps": skippable_steps(plan, role, seen.evaluations),
        "note": skip_note(plan, role, seen.evaluations),
        **below_smallest(plan, role, seen, outcome, estimate),
    }


def below_smallest(plan: CachePlan, role: str, seen: StageSeen, outcome: dict, estimate: dict | None) -> dict:
    """With the error criterion, a stage that could cache but cached nothing because its share of the target is
    below the smallest change any of its steps was estimated to make: a right answer at that target, said as one
    (its note, and `below_smallest_step` for the report's line)."""
    if not estimate or outcome.get("cached_steps") or estimate.get("smallest_step_estimate") is None \
            or not skippable_steps(plan, role, seen.evaluations):
        return {}
    smallest, share = estimate["smallest_step_estimate"], estimate["error_target_share"]
    if smallest <= share or share <= 0:
        return {}
    return {"below_smallest_step": True,
            "note": f"cached nothing, rightly: the smallest change one of the {ROLE_WORDS[role]} expert's steps was "
                    f"estimated to make ({smallest:.4g}) is more than its share of error_target "
                    f"{plan.error_target:g} ({share:.4g}); an error_target above "
                    f"{plan.error_target * smallest / share:.4g} may cache it"}
