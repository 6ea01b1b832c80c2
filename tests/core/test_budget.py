"""The error budget's calibration, without ComfyUI: the small and the full-size runs stood in for by a model
whose measured error is a factor times the error criterion's estimate, as the beds' are."""

import pytest

from wan22_cachedit.nodes.core import budget as B
from wan22_cachedit.nodes.core.errors import Wan22InputError


def stand_in(factor: float, smallest: float = 0.002, work: float = 0.1, full_factor: float | None = None):
    """small(target) and confirm(target): the criterion spends up to `target` in steps of `smallest` (it caches
    nothing below one step); the measured error is `factor` (at full size `full_factor`) times its estimate."""
    calls = {"small": [], "full": []}

    def runner(kind, f, cost):
        def run(target, calibrator="none"):
            calls[kind].append(target)
            steps = int(target / smallest + 1e-9)
            estimate = steps * smallest
            return B.Trial(target=target, error=f * estimate, estimate=estimate, cached=steps, smallest=smallest,
                           work=cost)
        return run
    return runner("small", factor, work), runner("full", factor if full_factor is None else full_factor, 1.7), calls


def test_a_budget_of_zero_caches_nothing_and_runs_nothing():
    small, full, calls = stand_in(1.0)
    result = B.calibrate(0.0, small, full)
    assert result.target == 0.0 and calls == {"small": [], "full": []} and result.work == 0


def test_the_target_is_scaled_by_what_this_model_measured_and_meets_the_budget():
    for factor in (0.5, 1.0, 1.8):
        small, full, calls = stand_in(factor)
        result = B.calibrate(0.03, small, full)
        assert result.full.error <= 0.03
        assert result.small[-1].error <= 0.03 * B.MARGIN
        assert result.factor == pytest.approx(factor)
        assert result.target == pytest.approx(calls["small"][-1])  # confirmed as it was found
        assert len(calls["small"]) <= B.SMALL_TRIALS and len(calls["full"]) == 1


def test_a_larger_budget_buys_a_larger_target():
    targets = [B.calibrate(budget, *stand_in(1.4)[:2]).target for budget in (0.01, 0.03, 0.05)]
    assert targets == sorted(targets) and targets[0] < targets[-1]


def test_a_full_size_run_that_misses_the_budget_scales_the_target_down_by_what_it_measured():
    small, full, calls = stand_in(1.0, full_factor=2.0)  # the small latent's factor does not hold at full size
    result = B.calibrate(0.03, small, full)
    assert result.full.error > 0.03
    scaled = calls["full"][0] * 0.03 * B.MARGIN / result.full.error
    # the scaled target confirmed once more (the work allows it) and held: it is the target
    assert calls["full"] == [calls["full"][0], pytest.approx(scaled)] and result.again[0].error <= 0.03 * B.MARGIN
    assert result.target == pytest.approx(scaled)


def steps_of(error: float, from_target: float = 0.01):
    """A model whose cache makes one jump: `error` at any target from `from_target` up, nothing below (the
    beds' error, at 20 steps, moves in such jumps)."""
    def run(target, calibrator="none"):
        cached = target >= from_target
        return B.Trial(target=target, error=error if cached else 0.0, estimate=target if cached else 0.0,
                       cached=int(cached), smallest=from_target, work=0.2)
    return run


def test_a_full_size_run_within_the_budget_but_over_the_aim_scales_the_target_to_the_aim():
    """The small runs land within the budget but over MARGIN x budget; so does the full run: the target is scaled
    to the aim, as for a full run over the budget (the seeds the sampler then runs vary around it)."""
    result = B.calibrate(0.03, steps_of(0.027), steps_of(0.027))
    assert all(0.03 * B.MARGIN < t.error <= 0.03 for t in result.small)
    chosen = max(result.small, key=lambda t: t.target)
    assert result.full.target == chosen.target and result.full.cached  # confirmed at the small runs' choice
    # confirmed once more at the scaled target: the same jump, 0.027 again, so scaled again
    scaled = result.full.target * 0.03 * B.MARGIN / 0.027
    assert [t.target for t in result.again] == [pytest.approx(scaled)] and result.again[0].error == 0.027
    assert result.target == pytest.approx(scaled * 0.03 * B.MARGIN / 0.027)
    assert result.target < result.full.target
    assert "again at target" in result.describe()


def test_without_a_confirmation_the_chosen_small_run_is_held_to_the_aim_too():
    result = B.calibrate(0.03, steps_of(0.027), None)
    chosen = max(result.small, key=lambda t: t.target)
    assert result.target == pytest.approx(chosen.target * 0.03 * B.MARGIN / 0.027)


def test_the_work_is_the_small_runs_and_one_full_confirmation():
    small, full, calls = stand_in(1.0, work=0.15)
    result = B.calibrate(0.03, small, full)
    assert result.work == pytest.approx(0.15 * len(calls["small"]) + 1.7) and result.again == []


def test_a_scaled_target_is_confirmed_again_only_where_the_work_allows():
    """A confirmation over the aim (0.045 against 0.04): its scaled target is run once more at full size where the
    calibration's work with that run (an uncached run's here: no small run below it) stays within MAX_WORK; it
    keeps the same cache pattern and measures the same, so it is scaled again. Where the work does not allow it,
    the scaled target is kept unconfirmed."""
    def small(work):
        def run(target, calibrator="none"):
            return B.Trial(target=target, error=0.035, estimate=target, cached=1, smallest=0.01, work=work,
                           calibrator=calibrator, cost=0.6)
        return run

    def confirm(target, calibrator, runs):  # the uncached run's work the first time only
        runs.append(target)
        return B.Trial(target=target, error=0.045, estimate=target, cached=1, smallest=0.01,
                       work=1.7 if len(runs) == 1 else 0.6, calibrator=calibrator, cost=0.6)
    scaled = 0.04 * 0.04 / 0.045  # the first small run (at the aim, 0.04) lands within it: the only one
    for small_work, again in ((0.2, True), (0.5, False)):  # 0.2 + 1.7 + 1 <= 3 < 0.5 + 1.7 + 1
        runs = []
        result = B.calibrate(0.05, small(small_work), lambda target, calibrator: confirm(target, calibrator, runs))
        assert [t.target for t in result.small] == [pytest.approx(0.04)] and bool(result.again) == again
        assert result.target == pytest.approx(scaled * 0.04 / 0.045 if again else scaled)
        assert result.work == pytest.approx(small_work + 1.7 + (0.6 if again else 0))


def test_a_scaled_target_that_caches_nothing_at_full_size_is_kept():
    """A re-confirmation whose scaled target caches no step at full size measures 0: it is kept (the budget then
    caches nothing, within the budget), not traded back for the target that measured over it."""
    def small(target, calibrator="none"):
        return B.Trial(target=target, error=0.035, estimate=target, cached=1, smallest=0.01, work=0.2,
                       calibrator=calibrator, cost=0.6)

    def confirm(target, calibrator):  # over the aim first, then nothing cached
        runs.append(target)
        if len(runs) == 1:
            return B.Trial(target=target, error=0.045, estimate=target, cached=1, smallest=0.01, work=1.7,
                           calibrator=calibrator, cost=0.6)
        return B.Trial(target=target, error=0.0, estimate=0.0, cached=0, smallest=None, work=1.0,
                       calibrator=calibrator, cost=1.0)
    runs = []
    result = B.calibrate(0.05, small, confirm)
    assert len(runs) == 2 and [t.error for t in result.again] == [0.0]
    assert result.target == pytest.approx(runs[1]) == pytest.approx(0.04 * 0.04 / 0.045)
    assert "again at target" in result.describe() and result.work == pytest.approx(0.2 + 1.7 + 1.0)


def test_without_a_confirmation_the_small_runs_are_the_calibration():
    small, _full, calls = stand_in(1.2)
    result = B.calibrate(0.03, small, None)
    assert result.full is None and calls["full"] == [] and result.small[-1].error <= 0.03


def test_a_budget_below_the_smallest_change_is_refused_naming_error_budget_and_that_change():
    small, full, calls = stand_in(1.0, smallest=0.05)  # one cached step changes 0.05: a budget of 0.01 cannot hold
    with pytest.raises(Wan22InputError) as refused:
        B.calibrate(0.01, small, full)
    assert refused.value.input_name == "error_budget"
    assert "0.0500" in str(refused.value) and calls["full"] == []


def test_a_run_with_nothing_to_cache_is_refused_naming_error_budget():
    def nothing(target, calibrator="none"):
        return B.Trial(target=target, error=0.0, estimate=0.0, cached=0, smallest=None, work=0.1)
    with pytest.raises(Wan22InputError, match="no step the cache could skip") as refused:
        B.calibrate(0.03, nothing, nothing)
    assert refused.value.input_name == "error_budget"


@pytest.mark.parametrize("budget", [-0.1, 1.5, float("nan"), float("inf")])
def test_a_budget_out_of_range_is_refused_naming_error_budget(budget):
    with pytest.raises(Wan22InputError) as refused:
        B.calibrate(budget, *stand_in(1.0)[:2])
    assert refused.value.input_name == "error_budget"


@pytest.mark.parametrize("size", [0.0, 0.05, 1.5, float("nan")])
def test_a_calibration_size_out_of_range_is_refused_naming_it(size):
    with pytest.raises(Wan22InputError) as refused:
        B.check_size(size)
    assert refused.value.input_name == "calibration_size"


def two_calibrators(factors: dict, smallest: float = 0.002, work: float = 0.2, full_work: float = 1.7):
    """small and confirm for two calibrators: the criterion caches one step per `smallest` of target, each step
    saving 3% of the blocks; the measured error is factors[calibrator] times the estimate."""
    calls = []

    def runner(kind, cost):
        def run(target, calibrator):
            calls.append((kind, calibrator, target))
            steps = min(int(target / smallest + 1e-9), 20)
            estimate = steps * smallest
            return B.Trial(target=target, error=factors[calibrator] * estimate, estimate=estimate, cached=steps,
                           smallest=smallest, work=cost, calibrator=calibrator, cost=1 - 0.03 * steps)
        return run
    return runner("small", work), runner("full", full_work), calls


def test_taylorseer_is_chosen_where_it_meets_the_budget_on_fewer_blocks_and_confirmed_with_it():
    small, full, calls = two_calibrators({"none": 2.0, "taylorseer": 0.8})
    plain = B.calibrate(0.05, small, full)  # the plan's calibrator alone
    assert plain.calibrator == "none" and {c for _k, c, _t in calls} == {"none"}
    calls.clear()
    both = B.calibrate(0.05, small, full, ("none", "taylorseer"))
    assert both.calibrator == "taylorseer" and both.target > plain.target
    assert both.full.calibrator == "taylorseer" and both.full.error <= 0.05 * B.MARGIN
    assert calls[-1] == ("full", "taylorseer", both.target)
    chosen = next(t for t in both.small if t.target == both.target and t.calibrator == "taylorseer")
    assert chosen.cost < min(t.cost for t in both.small if t.calibrator == "none" and t.error <= 0.05 * B.MARGIN)
    assert "with taylorseer" in both.describe()


def test_taylorseer_is_not_chosen_where_it_runs_no_fewer_blocks():
    small, full, calls = two_calibrators({"none": 1.0, "taylorseer": 1.0})  # the same error: no gain, more memory
    result = B.calibrate(0.05, small, full, ("none", "taylorseer"))
    assert result.calibrator == "none" and calls[-1][:2] == ("full", "none")


def test_another_calibrators_trials_stay_within_the_work_limit():
    """Each small run costs 0.45 full runs: the plain search's trials leave no room for another calibrator's
    trial and its confirmation (1 + its cost) within MAX_WORK, so none runs."""
    small, full, calls = two_calibrators({"none": 2.0, "taylorseer": 0.8}, work=0.45)
    result = B.calibrate(0.05, small, full, ("none", "taylorseer"))
    assert all(c == "none" for k, c, _t in calls if k == "small")
    assert result.calibrator == "none"
    small, full, calls = two_calibrators({"none": 2.0, "taylorseer": 0.8}, work=0.2)
    result = B.calibrate(0.05, small, full, ("none", "taylorseer"))
    spent_before_confirmation = sum(t.work for t in result.small)
    assert any(t.calibrator == "taylorseer" for t in result.small)
    assert spent_before_confirmation + 1 + max(t.cost for t in result.small) <= B.MAX_WORK


def plain_over_the_aim(full_plain: float, small_work: float):
    """A budget of 0.05 (aim 0.04): the plain small run lands within the aim (0.035), TaylorSeer's small runs
    over it (0.045, so the plain one is chosen); at full size the plain run measures `full_plain`, TaylorSeer
    0.6 x that at the same target and cost."""
    runs = []

    def small(target, calibrator):
        return B.Trial(target=target, error=0.035 if calibrator == "none" else 0.045, estimate=target, cached=2,
                       smallest=0.01, work=small_work, calibrator=calibrator, cost=0.6)

    def confirm(target, calibrator):
        runs.append((calibrator, target))
        error = full_plain * (1.0 if calibrator == "none" else 0.6)
        return B.Trial(target=target, error=error, estimate=target, cached=2, smallest=0.01,
                       work=1.7 if len(runs) == 1 else 0.6, calibrator=calibrator, cost=0.6)
    return small, confirm, runs


def test_a_plain_full_run_within_the_budget_but_over_the_aim_keeps_its_target_with_taylorseer():
    """0.045 at full size: within 0.05, over its aim. Where TaylorSeer is allowed the target is kept and its
    cached steps forecast (the same steps, less error) instead of scaled down (a cached step given up); confirmed
    once more at full size where the work allows (0.1 x 4 small runs + 1.7 + 0.6 <= 3), else kept unconfirmed."""
    for small_work, again in ((0.1, True), (0.2, False)):
        small, confirm, runs = plain_over_the_aim(0.045, small_work)
        result = B.calibrate(0.05, small, confirm, ("none", "taylorseer"))
        assert result.full.calibrator == "none" and result.full.error == 0.045
        assert result.calibrator == "taylorseer" and result.target == result.full.target
        assert runs[1:] == ([("taylorseer", result.full.target)] if again else [])
        assert [t.error for t in result.again] == ([pytest.approx(0.027)] if again else [])
        assert result.work <= B.MAX_WORK and "then taylorseer at that target" in result.describe()


def test_a_plain_full_run_over_the_budget_or_without_taylorseer_scales_its_target_down():
    """Over the budget itself (0.055) TaylorSeer's factor (0.32 to 1.0 x on the tuning bed) may not bring it
    within: the target is scaled, the plain cache kept. With the plain calibrator alone, 0.045 scales too."""
    for full_plain, calibrators in ((0.055, ("none", "taylorseer")), (0.045, ("none",))):
        small, confirm, runs = plain_over_the_aim(full_plain, 0.1)
        result = B.calibrate(0.05, small, confirm, calibrators)
        assert result.calibrator == "none" and {c for c, _t in runs} == {"none"}
        scaled = (result.again[0] if result.again else result).target
        assert scaled == pytest.approx(result.full.target * 0.04 / full_plain)
