"""The error budget's search, without ComfyUI: measured runs stood in for by an error that grows with each
expert's threshold, as a cache's does."""

import math

import pytest

from wan22_cachedit.nodes.core import budget as B
from wan22_cachedit.nodes.core.errors import Wan22InputError

UNCACHED = 1000


def stand_in(cost: dict, floor: dict | None = None):
    """measure(): each expert adds cost[role] * threshold to the error (in quadrature) and saves blocks as its
    threshold grows; below floor[role] it caches nothing at all."""
    floor = floor or {}
    calls = []

    def measure(thresholds):
        calls.append(dict(thresholds))
        error, saved = 0.0, 0
        for role, t in thresholds.items():
            if t is None or t < floor.get(role, 0.0):
                continue
            error += (cost[role] * t) ** 2
            saved += int(400 * min(t, 1.0))
        return B.Trial(thresholds, math.sqrt(error), UNCACHED - saved)
    return measure, calls


def test_a_budget_of_zero_caches_nothing_and_runs_nothing():
    measure, calls = stand_in({"high": 1.0, "low": 1.0})
    result = B.calibrate(0.0, ("high", "low"), measure, UNCACHED)
    assert result.thresholds == {"high": None, "low": None} and calls == []


def test_the_calibrated_thresholds_meet_the_budget_with_its_margin_on_the_calibration_run():
    measure, _ = stand_in({"high": 0.5, "low": 0.2})
    for budget in (0.01, 0.03, 0.05):
        result = B.calibrate(budget, ("high", "low"), measure, UNCACHED)
        assert result.error <= budget * B.MARGIN
        assert measure(result.thresholds).error == pytest.approx(result.error)
        assert all(t is None or t in B.LADDER for t in result.thresholds.values())


def test_a_larger_budget_buys_larger_thresholds_and_fewer_block_forwards():
    measure, _ = stand_in({"high": 0.5, "low": 0.2})
    results = [B.calibrate(b, ("high", "low"), measure, UNCACHED) for b in (0.01, 0.03, 0.05)]
    forwards = [r.block_forwards for r in results]
    assert forwards[0] > forwards[1] > forwards[2]
    for role in ("high", "low"):
        thresholds = [r.thresholds[role] or 0.0 for r in results]  # None: uncached
        assert thresholds == sorted(thresholds) and thresholds[-1] > 0


def test_the_expert_that_costs_less_per_threshold_gets_the_larger_threshold():
    measure, _ = stand_in({"high": 1.0, "low": 0.1})
    result = B.calibrate(0.05, ("high", "low"), measure, UNCACHED)
    assert result.thresholds["low"] > result.thresholds["high"]


def test_one_expert_alone_is_calibrated_alone():
    measure, calls = stand_in({"low": 0.3})
    result = B.calibrate(0.03, ("low",), measure, UNCACHED)
    assert set(result.thresholds) == {"low"} and result.thresholds["low"] is not None
    assert all(set(c) == {"low"} for c in calls)


def test_a_budget_no_cached_step_fits_in_is_refused_naming_error_budget():
    measure, _ = stand_in({"high": 100.0, "low": 100.0})
    with pytest.raises(Wan22InputError, match=r"^error_budget: 0.001 cannot be met") as refused:
        B.calibrate(0.001, ("high", "low"), measure, UNCACHED)
    assert "set it to 0 to cache nothing" in str(refused.value)


def test_a_run_with_nothing_to_cache_is_refused_naming_error_budget():
    measure, _ = stand_in({"high": 1.0, "low": 1.0}, floor={"high": 9.0, "low": 9.0})
    with pytest.raises(Wan22InputError, match=r"^error_budget: .*no step the cache could skip"):
        B.calibrate(0.05, ("high", "low"), measure, UNCACHED)


@pytest.mark.parametrize("budget", [-0.01, 1.5, float("nan"), float("inf"), "0.03", None])
def test_a_budget_out_of_range_is_refused_naming_error_budget(budget):
    with pytest.raises(Wan22InputError, match=r"^error_budget: "):
        B.check_budget(budget)


def test_an_expert_that_cannot_cache_within_its_share_leaves_the_budget_to_the_other():
    """Each expert alone costs more than half the budget at its smallest threshold, one of them less than all
    of it: that one caches, alone, within the budget."""
    measure, _ = stand_in({"high": 2.0, "low": 0.6})
    budget = 0.006 / (B.MARGIN * 0.9)  # low's smallest threshold (0.01) costs 0.006: within it, not within half
    result = B.calibrate(budget, ("high", "low"), measure, UNCACHED)
    assert result.thresholds["high"] is None and result.thresholds["low"] is not None
    assert result.error <= budget * B.MARGIN


def test_each_setting_is_measured_once():
    measure, calls = stand_in({"high": 0.5, "low": 0.2})
    B.calibrate(0.05, ("high", "low"), measure, UNCACHED)
    keys = [tuple(sorted(c.items())) for c in calls]
    assert len(keys) == len(set(keys))


def test_a_smallest_threshold_that_caches_nothing_does_not_count_as_fitting():
    """Found on the bed: both experts' smallest threshold cached nothing (error 0, within any share) and the
    next ones cost more than a share; the expert that fits the whole budget alone must still get it."""
    measure, _ = stand_in({"high": 2.0, "low": 0.45}, floor={"high": 0.011, "low": 0.011})
    budget = 0.006 / (B.MARGIN * 0.9)  # low at 0.0125 costs 0.0056: within the budget, not within a share
    result = B.calibrate(budget, ("high", "low"), measure, UNCACHED)
    assert result.thresholds["high"] is None and result.thresholds["low"] is not None
    assert result.block_forwards < UNCACHED and result.error <= budget * B.MARGIN


def within(budget: float, calibration_error: float, confirmation_error: float) -> bool:
    """The documented test of two seeds: their mean within the budget's margin, each within the budget."""
    return ((calibration_error + confirmation_error) / 2 <= budget * B.MARGIN
            and max(calibration_error, confirmation_error) <= budget)


def test_settings_the_confirming_seed_misses_step_down_until_it_meets_the_target_too():
    measure, _ = stand_in({"high": 0.5, "low": 0.2})
    confirm, _ = stand_in({"high": 1.0, "low": 0.6})  # the other seed: the same settings cost more
    alone = B.calibrate(0.03, ("high", "low"), measure, UNCACHED)
    # the calibration run alone would promise too much
    assert not within(0.03, alone.error, confirm(alone.thresholds).error)
    result = B.calibrate(0.03, ("high", "low"), measure, UNCACHED, confirm=confirm)
    assert result.confirmation_error == pytest.approx(confirm(result.thresholds).error)
    assert within(0.03, result.error, result.confirmation_error)
    assert result.block_forwards < UNCACHED and result.block_forwards > alone.block_forwards
    measured = [tuple(sorted(t.thresholds.items())) for t in result.confirmations]
    assert len(measured) == len(set(measured)) > 1  # each setting confirmed once; the first one missed


def test_the_two_seeds_mean_is_held_to_the_target_and_each_seed_to_the_budget():
    """A confirming seed costlier than the target but within the budget does not make the settings step down
    while the two seeds' mean meets the target (the median over seeds is what the budget promises)."""
    measure, _ = stand_in({"high": 0.5, "low": 0.2})
    confirm, _ = stand_in({"high": 0.8, "low": 0.3})
    result = B.calibrate(0.03, ("high", "low"), measure, UNCACHED, confirm=confirm)
    assert result.target < result.confirmation_error <= 0.03
    assert (result.error + result.confirmation_error) / 2 <= result.target


def test_a_budget_only_the_calibration_run_meets_is_refused_naming_the_confirming_seed():
    measure, _ = stand_in({"high": 0.5, "low": 0.5})
    confirm, _ = stand_in({"high": 1000.0, "low": 1000.0})
    with pytest.raises(Wan22InputError, match=r"^error_budget: 0.03 cannot be met: .* on the confirming seed"):
        B.calibrate(0.03, ("high", "low"), measure, UNCACHED, confirm=confirm)


def test_no_expert_can_step_up_a_rung_that_caches_more_and_still_meets_the_target():
    """The search uses the headroom the ladder's steps leave: from its result, one rung up on any cached expert
    either caches nothing more or misses the budget's test of the two seeds."""
    measure, _ = stand_in({"high": 0.5, "low": 0.05})  # low's share alone leaves room beside high's
    confirm, _ = stand_in({"high": 0.5, "low": 0.05})
    for budget in (0.01, 0.03, 0.05):
        result = B.calibrate(budget, ("high", "low"), measure, UNCACHED, confirm=confirm)
        for role, threshold in result.thresholds.items():
            if threshold is None or threshold == B.LADDER[-1]:
                continue
            higher = {**result.thresholds, role: B.LADDER[B.LADDER.index(threshold) + 1]}
            assert (measure(higher).block_forwards >= result.block_forwards
                    or not within(budget, measure(higher).error, confirm(higher).error)), (budget, role)
