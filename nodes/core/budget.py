"""An error budget instead of a threshold: the per-expert thresholds that keep a run's final latent within a
relative L2 the user states, found by measuring on one calibration run.

The search is pure: it is handed `measure(thresholds) -> Trial`, which runs the calibration run with those
per-expert thresholds (None: that expert uncached) and compares its final latent with the uncached one. Each
expert first gets its own share of the budget, found alone (the other expert uncached) by bisection on a
ladder of thresholds; then both run together, and while that misses the target, the expert that costs more
alone steps one rung down; once it is met, the expert that costs less alone steps up while that caches more
and still meets it. The target is the budget times a margin, since a calibration seed is one sample
of the seeds the settings will then run with; and a setting is kept only when a second sample agrees: given
`confirm(thresholds) -> Trial` (the same run on another seed, against its own uncached run), the two runs'
mean error must meet the target and neither may exceed the budget itself, or the costlier expert steps down
again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .errors import Wan22InputError

# Thresholds tried, 0.01 to about 0.87, each 1.25 times the last: a step is cached while the first blocks'
# residual changed less than this (relative L1) since the last computed step.
LADDER = tuple(round(0.01 * 1.25 ** k, 5) for k in range(21))
# Calibrate to 0.75 of the budget: a seed is one sample of the seeds the settings then run with (on the trained bed,
# other seeds and prompts cost up to about twice the calibration run, bench/quality.py). With a confirming seed the
# mean of the two runs' errors is the estimate held to the target, and each run alone is held to the budget. Set
# on the bed: at 0.8 a budget of 0.01 at 20 steps missed on the other seeds, at 0.7 it found nothing to cache.
MARGIN = 0.75
MAX_BUDGET = 1.0


@dataclass(frozen=True)
class Trial:
    thresholds: dict  # role -> threshold, or None (uncached)
    error: float  # relative L2 of the final latent against the uncached run
    block_forwards: int  # transformer blocks run, over the whole run


@dataclass
class Calibration:
    budget: float
    target: float
    thresholds: dict  # role -> the threshold chosen, or None (that expert uncached)
    error: float  # what the chosen thresholds cost on the calibration run
    block_forwards: int
    uncached_block_forwards: int
    trials: list = field(default_factory=list)
    confirmations: list = field(default_factory=list)  # the same settings on the confirming seed
    confirmation_error: float | None = None  # what the chosen thresholds cost there (None: not confirmed)

    def describe(self) -> str:
        used = ", ".join(f"{role} {'uncached' if t is None else f'threshold {t:g}'}"
                         for role, t in self.thresholds.items())
        confirmed = ("" if self.confirmation_error is None
                     else f", confirming seed {self.confirmation_error:.4f}")
        return (f"error budget {self.budget:g} (calibrated to {self.target:.3g}): {used}; calibration run error "
                f"{self.error:.4f}{confirmed}, blocks {self.block_forwards}/{self.uncached_block_forwards} "
                f"({100 * (1 - self.block_forwards / self.uncached_block_forwards):.0f}% saved), "
                f"{len(self.trials) + len(self.confirmations)} calibration runs")


def check_budget(budget: float) -> float:
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and 0 <= budget <= MAX_BUDGET):
        raise Wan22InputError("error_budget", f"{budget!r} must be between 0 (cache nothing) and {MAX_BUDGET:g} "
                                              "(a relative L2 of the final latent against the uncached run; 0.03 "
                                              "is a small change)")
    return float(budget)


def calibrate(budget: float, roles: tuple[str, ...], measure: Callable[[dict], Trial], uncached_block_forwards: int,
              margin: float = MARGIN, confirm: Callable[[dict], Trial] | None = None) -> Calibration:
    """The per-expert thresholds for `budget` (see the module's text). A budget of 0 caches nothing and runs
    nothing; a budget no cached step fits in (on the calibration run, or on the confirming one) is refused,
    naming error_budget."""
    budget = check_budget(budget)
    if budget == 0:
        return Calibration(budget, 0.0, {role: None for role in roles}, 0.0, uncached_block_forwards,
                           uncached_block_forwards)
    target = budget * margin
    trials: list[Trial] = []
    confirmations: list[Trial] = []
    seen: dict = {}

    def memo(trials_of: list, measure_of: Callable[[dict], Trial], thresholds: dict) -> Trial:
        key = (id(trials_of), tuple(sorted(thresholds.items())))
        if key not in seen:  # the same settings give the same run: measured once
            seen[key] = measure_of(dict(thresholds))
            trials_of.append(seen[key])
        return seen[key]

    def run(thresholds: dict) -> Trial:
        return memo(trials, measure, thresholds)

    def meets(thresholds: dict) -> bool:  # on the calibration run, and on the confirming run once that could
        error = run(thresholds).error
        if confirm is None:
            return error <= target
        if error > budget:
            return False
        confirmed = memo(confirmations, confirm, thresholds).error
        return confirmed <= budget and (error + confirmed) / 2 <= target

    def caches(role: str) -> bool:  # the expert's rung fits and caches something (the lowest may cache nothing)
        return rung[role] >= 0 and run({**{r: None for r in roles}, role: LADDER[rung[role]]}).block_forwards \
            < uncached_block_forwards

    rung = {role: -1 for role in roles}  # each expert's rung alone (-1: none fits), and what it costs alone
    solo = {role: 0.0 for role in roles}
    active = list(roles)
    while active:
        share = target / math.sqrt(len(active))
        for role in active:
            alone = {r: None for r in roles}
            lo, hi = rung[role], len(LADDER)  # LADDER[lo] fits (or none does), LADDER[hi] does not (or past the end)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                error = run({**alone, role: LADDER[mid]}).error
                if error <= share:
                    lo, solo[role] = mid, error
                else:
                    hi = mid
            rung[role] = lo
        fitting = [role for role in active if caches(role)]
        if len(fitting) == len(active) or len(active) == 1:
            break
        if fitting:  # an expert that cannot cache within its share leaves the budget to the others
            active = fitting
            continue
        # none fits a share: the one whose cheapest cached run costs least gets the whole target
        costs = {role: min((t.error for t in trials if t.thresholds[role] is not None
                            and t.block_forwards < uncached_block_forwards), default=math.inf) for role in active}
        active = [min(active, key=lambda role: costs[role])]
    rung = {role: i if caches(role) else -1 for role, i in rung.items()}
    while True:
        thresholds = {role: LADDER[i] if i >= 0 else None for role, i in rung.items()}
        if all(t is None for t in thresholds.values()):
            break
        if meets(thresholds):
            break
        worst = max((role for role in roles if rung[role] >= 0), key=lambda role: solo[role])
        rung[worst] -= 1
        solo[worst] *= 0.5  # one rung down costs less; the other expert steps down next if this is not enough
    if any(t is not None for t in thresholds.values()):  # headroom left: the cheaper expert steps up while that
        stuck: set = set()                                 # caches more and still meets the budget (`meets`)
        while movable := [r for r in roles if r not in stuck and 0 <= rung[r] < len(LADDER) - 1]:
            role = min(movable, key=lambda r: solo[r])
            higher = {**thresholds, role: LADDER[rung[role] + 1]}
            if run(higher).block_forwards < run(thresholds).block_forwards and meets(higher):
                rung[role] += 1
                thresholds = higher
            else:
                stuck.add(role)
    final = (run(thresholds) if any(t is not None for t in thresholds.values())
             else Trial(thresholds, 0.0, uncached_block_forwards))
    if final.block_forwards >= uncached_block_forwards:
        cheapest = min((t for t in trials if t.block_forwards < uncached_block_forwards), key=lambda t: t.error,
                       default=None)
        if cheapest is None:
            raise Wan22InputError("error_budget", f"{budget:g}: this run has no step the cache could skip (its "
                                                  "steps are all warm-up or capped): lower the warm-up steps, or "
                                                  "leave Cache-DiT off")
        missed = min((t.error for t in confirmations if t.block_forwards < uncached_block_forwards), default=None)
        confirmed = ("" if missed is None else f", and {missed:.4f} on the confirming seed for settings within the "
                                               "budget on the calibration run")
        allows = (f"the budget allows {target:.4f}" if confirm is None else
                  f"the budget allows a mean of {target:.4f} over the two seeds, and {budget:g} on each")
        raise Wan22InputError("error_budget", f"{budget:g} cannot be met: the smallest change any threshold made "
                                              f"on this run is {cheapest.error:.4f}{confirmed} (with margin "
                                              f"{margin:g}, {allows}); raise error_budget, set it to 0 to cache "
                                              "nothing, or leave Cache-DiT off")
    confirmation = memo(confirmations, confirm, thresholds) if confirm is not None else None
    return Calibration(budget, target, thresholds, final.error, final.block_forwards, uncached_block_forwards,
                       trials, confirmations, None if confirmation is None else confirmation.error)
