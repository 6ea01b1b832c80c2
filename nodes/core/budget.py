"""An error budget: the error criterion's target calibrated on the user's own model, for a few runs' work.

The error criterion (core.cache.ErrorAllowance) estimates what each cached step changes in the final latent from
what the run measures, with one factor (its propagation) chosen on the tuning bed; on another model the estimate
is off by a factor. A budget measures what the cache costs on this model and sets the target so that the measured
error meets the budget, in three phases: `small_plain_runs`, `calibrator_trial` and `confirmation`, put together
by `calibrate`. The algorithm, its constants and why each is what it is: docs/quality.md, "How the budget
calibrates" (described there only). The search is pure: it is handed the runs as functions of (target,
calibrator) and counts their work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .errors import Wan22InputError

MAX_BUDGET = 1.0
MIN_SIZE = 0.1  # the smallest calibration_size: a tenth of the width and height
# Aim every calibration run at this share of the budget, the full-size confirmation too: the full run measured
# 0.6 to 1.5 times the small runs' error on the beds, and the seeds the budget then runs on measured up to 1.5
# times the calibration seed's on the tuning bed (bench/quality/); a full run within the budget but over the
# aim left the tuning bed's cases over the budget at 20 steps.
MARGIN = 0.8
SMALL_TRIALS = 3
MAX_WORK = 3.0  # the calibration's work, in full-size uncached runs, that another calibrator's trial may not pass
# TaylorSeer's error over the plain criterion's at the same target: on the tuning bed, the median of the ratio
# over its swept targets (0.015 to 0.05) at 20 and 40 steps (bench/quality/judge.py `choose`).
TAYLORSEER_ERROR = 0.89
FORECAST = "taylorseer"  # the calibrator a plain run over the aim switches to (forecast_instead)


@dataclass(frozen=True)
class Trial:
    """One cached run of the calibration against the same run without the cache."""

    target: float  # the error criterion's target it ran with
    error: float  # relative L2 of its final latent against the uncached run
    estimate: float  # the criterion's own estimate of that error
    cached: int  # evaluations served from the cache
    smallest: float | None  # the smallest change one cached step was estimated to make (None: no step compared)
    work: float  # its transformer work and its uncached run's, in full-size uncached runs
    calibrator: str = "none"  # cache-dit's calibrator it ran with
    cost: float = 1.0  # its block forwards over its uncached run's


@dataclass
class Calibration:
    budget: float
    target: float  # the error criterion's calibrated target
    small: list = field(default_factory=list)  # the small latent's trials
    full: Trial | None = None  # the confirmation at full size
    again: list = field(default_factory=list)  # the scaled targets confirmed again at full size, in order
    factor: float | None = None  # measured error over the criterion's estimate on this model
    calibrator: str = "none"  # the calibrator chosen with the target

    @property
    def work(self) -> float:
        """The calibration's transformer work, in full-size uncached runs."""
        return sum(t.work for t in [*self.small, *self.again]) + (self.full.work if self.full else 0.0)

    def describe(self) -> str:
        if self.budget == 0:
            return "error budget 0: nothing is cached"
        full = ("" if self.full is None else
                f"; at full size {self.full.error:.4f} (estimate {self.full.estimate:.4f})")
        if self.full is not None and self.full.calibrator != self.calibrator:
            full += f", then {self.calibrator} at that target"
        full += "".join(f", again at target {t.target:.4g}: {t.error:.4f}" for t in self.again)
        small = ", ".join(f"{t.error:.4f}" + ("" if t.calibrator == "none" else f" ({t.calibrator})")
                          for t in self.small)
        factor = "" if self.factor is None else f" (this model's error is {self.factor:.2f} x the criterion's estimate)"
        calibrator = "" if self.calibrator == "none" else f" with {self.calibrator}"
        return (f"error budget {self.budget:g}: error target {self.target:.4g}{calibrator}{factor}; small runs "
                f"{small}{full}; work about {self.work:.1f} full runs")


def relative_l2(reference, other) -> float:
    """The error a budget bounds (and every quality figure of the pack): the L2 norm of the difference of two
    final latents (tensors) over the reference's."""
    return float((other.float() - reference.float()).norm() / reference.float().norm().clamp(min=1e-12))


def check_budget(budget: float) -> float:
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and 0 <= budget <= MAX_BUDGET):
        raise Wan22InputError("error_budget", f"{budget!r} must be between 0 (cache nothing) and {MAX_BUDGET:g} "
                                              "(a relative L2 of the final latent against the uncached run; 0.03 "
                                              "is a small change)")
    return float(budget)


def check_size(size: float) -> float:
    if not (isinstance(size, (int, float)) and math.isfinite(size) and MIN_SIZE <= size <= 1):
        raise Wan22InputError("calibration_size", f"{size!r} must be between {MIN_SIZE:g} and 1 (the small runs' "
                                                  "width and height as a share of the latent's; 0.5 is the default)")
    return float(size)


def refuse_below_smallest(budget: float, trials: list) -> None:
    """No trial met the budget: refused by name, with the smallest change the cache made (the smallest measured
    error of a run that cached something, else the smallest change one step was estimated to make)."""
    cached = [t.error for t in trials if t.cached]
    estimated = [t.smallest for t in trials if t.smallest is not None]
    if not cached and not estimated:
        raise Wan22InputError("error_budget", f"{budget:g}: this run has no step the cache could skip (its steps "
                                              "are all warm-up or capped): lower the warm-up steps, or leave "
                                              "Cache-DiT off")
    smallest = min(cached) if cached else min(estimated)
    raise Wan22InputError("error_budget", f"{budget:g} cannot be met: the smallest change the cache made on this run "
                                          f"is {smallest:.4f}; raise error_budget above it, set it to 0 to cache "
                                          "nothing, or leave Cache-DiT off")


def search(budget: float, small: Callable[[float], Trial], target: float, trials: int,
           room: Callable[[list], bool] = lambda found: True) -> list:
    """Small runs from `target`, each trial's target scaled by what it measured (the error grows about in
    proportion to the target), doubled while nothing is cached, until a trial lands within [0.7, 1] x MARGIN x
    budget, `trials` have run, or `room` (given the trials found so far) says no more fits."""
    aim = budget * MARGIN
    found = []
    for _ in range(trials):
        if not room(found):
            break
        trial = small(target)
        found.append(trial)
        if trial.cached and 0.7 * aim <= trial.error <= aim:
            break
        # at most 4 times further each trial, and never past the largest target the criterion takes
        target = min(MAX_BUDGET, target * min(4.0, aim / trial.error if trial.cached and trial.error > 0 else 2.0))
    return found


def best(budget: float, trials: list, calibrators: tuple = ("none",)) -> Trial | None:
    """The trial to run with: of those that cached and met the budget, within the aim first, then the fewest
    block forwards, then the first calibrator (less memory), then the largest target."""
    aim = budget * MARGIN
    met = [t for t in trials if t.cached and t.error <= budget]
    order = {c: i for i, c in enumerate(calibrators)}
    return max(met, key=lambda t: (t.error <= aim, -round(t.cost, 6), -order.get(t.calibrator, 0), t.target),
               default=None)


def again_cost(target: float, last: Trial, trials: list) -> float:
    """The work of confirming `target` again at full size, below `last`'s: its cached run alone (the uncached one
    is kept), estimated as the block cost of the small run with its calibrator at the largest target below it
    (and no less than `last` ran), or an uncached run's where none is. An estimate: at full size the same target
    may cache other steps than at the small size."""
    below = [t for t in trials if t.calibrator == last.calibrator and t.target <= target]
    return max(last.cost, max(below, key=lambda t: t.target).cost) if below else 1.0


def forecast_instead(budget: float, last: Trial, calibrators: tuple) -> bool:
    """A run of the plain cache within the budget but over the aim: TaylorSeer at the same target, where the
    caller allows it, rather than a target scaled down. The criterion decides which steps to cache from the
    computed steps alone, so the same target caches about the same steps; TaylorSeer forecasts them instead of
    reusing the last residual, which measured TAYLORSEER_ERROR (0.32 to 1.0) x the plain cache's error: the
    aim where its factor holds, the budget still where it changes nothing. A scaled target would give up a
    cached step to buy the same margin."""
    return last.calibrator == "none" and FORECAST in calibrators and last.error <= budget


def small_plain_runs(budget: float, small: Callable[[float, str], Trial], calibrator: str) -> list:
    """Phase 1: small runs of the first calibrator from the aim, each target scaled by what the last measured."""
    return search(budget, lambda target: small(target, calibrator), budget * MARGIN, SMALL_TRIALS)


def calibrator_trial(budget: float, small: Callable[[float, str], Trial], trials: list, calibrator: str,
                     calibrators: tuple, confirming: bool) -> list | None:
    """Phase 2: small runs of another `calibrator`, from the target the trials so far call for scaled by
    TAYLORSEER_ERROR, while the calibration's work, the confirmation counted in where there is one (`confirming`),
    stays within MAX_WORK; None where the trials so far met nothing (the budget is then refused)."""
    plain = best(budget, trials, calibrators)
    if plain is None or plain.error <= 0:
        return None

    def room(found: list, before: list = list(trials)) -> bool:
        """Another small run, then the confirmation (one run without the cache and one with it at the largest
        block cost measured), within MAX_WORK."""
        done = before + found
        step = max(t.work for t in done[1:]) if len(done) > 1 else done[0].work
        confirmation = (1 + max(t.cost for t in done)) if confirming else 0.0
        return sum(t.work for t in done) + step + confirmation <= MAX_WORK

    start = min(MAX_BUDGET, plain.target * min(4.0, budget * MARGIN / plain.error) / TAYLORSEER_ERROR)
    return search(budget, lambda target: small(target, calibrator), start, SMALL_TRIALS, room)


def confirmation(budget: float, calibration: "Calibration", chosen: Trial, trials: list,
                 confirm: Callable[[float, str], Trial] | None, calibrators: tuple) -> None:
    """Phase 3: the chosen small run's target and calibrator at full size (`confirm`), held to the aim: over it, the
    target is scaled down to it, or a plain run within the budget keeps its target with TaylorSeer
    (`forecast_instead`), and the change is confirmed once more where the work allows. Without `confirm`
    (calibration at full size) the chosen run itself is held to the aim."""
    aim = budget * MARGIN
    if confirm is not None:
        calibration.full = confirm(chosen.target, chosen.calibrator)
    last = calibration.full or chosen
    if last.error <= aim:
        return
    if forecast_instead(budget, last, calibrators):
        calibration.calibrator = FORECAST  # the same target: its cached steps forecast instead of reused
        again = last.cost
    else:
        calibration.target = last.target * aim / last.error
        again = again_cost(calibration.target, last, trials)
    if confirm is not None and calibration.work + again <= MAX_WORK:
        last = confirm(calibration.target, calibration.calibrator)  # once more: did the change hold?
        calibration.again.append(last)
        if last.error > aim:
            calibration.target = last.target * aim / last.error


def calibrate(budget: float, small: Callable[[float, str], Trial],
              confirm: Callable[[float, str], Trial] | None = None, calibrators: tuple = ("none",)) -> Calibration:
    """The error criterion's target and calibrator for `budget` (docs/quality.md, "How the budget calibrates");
    `small` and `confirm` run (target, calibrator), `confirm` at full size; `calibrators`: those allowed, the first
    preferred."""
    budget = check_budget(budget)
    if budget == 0:
        return Calibration(0.0, 0.0, calibrator=calibrators[0])
    first = calibrators[0]
    trials = small_plain_runs(budget, small, first)
    for other in calibrators[1:]:
        found = calibrator_trial(budget, small, trials, other, calibrators, confirm is not None)
        if found is None:
            break  # the first calibrator met nothing: the budget is refused below
        trials += found
    chosen = best(budget, trials, calibrators)
    if chosen is None:
        refuse_below_smallest(budget, trials)
    calibration = Calibration(budget, chosen.target, trials, calibrator=chosen.calibrator)
    confirmation(budget, calibration, chosen, trials, confirm, calibrators)
    measured = [t for t in [*trials, calibration.full, *calibration.again] if t is not None and t.cached
                and t.estimate > 0 and t.calibrator == first]
    calibration.factor = (sum(t.error / t.estimate for t in measured) / len(measured)) if measured else None
    return calibration
