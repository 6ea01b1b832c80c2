"""The error criterion's arithmetic, without ComfyUI: each step's estimate from the run's own statistics, the
stages' shares of the run's target, and what a call may cache."""

import pytest

from wan22_cachedit.nodes import cache_dit_backend as backend
from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core.errors import Wan22InputError

SIGMAS = (1.0, 0.9, 0.7, 0.4, 0.0)
P = C.propagation(0.5)  # how far an error made at the tests' sigma (below the band) is carried


def test_a_steps_sigma_gap_is_the_stride_to_the_next_sigma_also_between_sigmas_and_at_the_end():
    assert C.sigma_gap(0.9, SIGMAS) == pytest.approx(0.2)
    assert C.sigma_gap(0.8, SIGMAS) == pytest.approx(0.1)  # a second-order sampler's evaluation inside a step
    assert C.sigma_gap(0.4, SIGMAS) == pytest.approx(0.4)  # the last step: to 0
    assert C.sigma_gap(0.4, SIGMAS[:4]) == pytest.approx(0.4)  # a stage's slice ending above 0: past it, to 0


def measured(target=1.0, rho=0.2, sigma=0.5, sigmas=(0.5, 0.4), **caps):
    """An allowance that has heard one computed step's miss: rho x the step's residual change."""
    a = C.ErrorAllowance(target, **caps)
    a.at(sigma, sigmas)
    a.seen(0.05, cached=False)
    a.missed(rho * 0.05, 0.05)
    return a


def step(a, diff, cached, sigma=0.5, sigmas=(0.5, 0.4), share=1.0):
    a.at(sigma, sigmas)
    a.seen(diff, cached=cached, share=share)


def test_nothing_is_cached_until_a_miss_is_measured_in_this_run():
    a = C.ErrorAllowance(1.0)
    a.at(0.5, (0.5, 0.4))
    assert a.threshold() == C.COMPARE  # compared (so the step's change is heard), never cached
    a.seen(0.05, cached=False)
    a.missed(0.01, 0.05)
    a.at(0.4, (0.5, 0.4))
    assert a.threshold() > C.COMPARE


def test_a_target_of_zero_caches_nothing_and_a_threshold_never_reads_as_always():
    assert measured(0.0).threshold() == C.COMPARE
    assert measured(100.0).threshold() == 0.99  # cache-dit reads 1.0 or more as "cache whatever changed"


def test_the_miss_per_change_is_measured_and_a_call_may_cache_while_its_estimate_fits_what_is_left():
    a = measured(0.01, rho=0.2)  # a miss of 0.2 x the change, a gap of 0.1: an estimate of P x 0.02 x the change
    a.at(0.5, (0.5, 0.4))
    assert a.threshold() == pytest.approx(0.01 / (P * 0.2 * 0.1))
    a.seen(0.1, cached=True)
    assert a.spent == pytest.approx(P * 0.02 * 0.1)
    a.at(0.5, (0.5, 0.4))
    assert a.threshold() == pytest.approx((0.01 - P * 0.002) / (P * 0.02))  # the run in progress adds up
    assert a.estimate()["miss_per_change"] == [0.2]


def test_the_step_that_ends_a_run_of_cached_steps_estimates_the_run_again_with_its_miss():
    a = measured(0.05, rho=0.2)
    step(a, 0.1, cached=True)
    step(a, 0.2, cached=True)
    assert a.spent == pytest.approx(P * 0.2 * 0.1 * 0.3)
    step(a, 0.25, cached=False)  # computed: its miss says the run missed by 0.4 x the change, not 0.2
    a.missed(0.4 * 0.25, 0.25)
    closed = P * 0.4 * 0.1 * 0.3
    assert a.spent == pytest.approx(closed)
    a.at(0.5, (0.5, 0.4))  # the next run may spend what the closed one leaves, in quadrature
    assert a.threshold() == pytest.approx((0.05 ** 2 - closed ** 2) ** 0.5 / (P * 0.4 * 0.1))


def test_cached_steps_add_up_in_a_row_and_runs_parted_by_computed_steps_in_quadrature():
    a = measured(1.0, rho=0.2)
    for cached in (True, True, False, True):
        step(a, 0.5, cached)
    # two in a row: 2 x one step's; then a computed step (no miss heard: the run keeps its estimate); then one
    one = P * 0.01
    assert a.spent == pytest.approx((4 + 1) ** 0.5 * one)
    computed_unheard = measured(1.0, rho=0.2)  # a computed step cache-dit never compared (warm-up) parts them too
    for heard in (True, None, True):
        computed_unheard.at(0.5, (0.5, 0.4))
        if heard:
            computed_unheard.seen(0.5, cached=True)
    assert computed_unheard.spent == pytest.approx(2 ** 0.5 * one)
    assert computed_unheard.closed == pytest.approx(one)  # the first run, closed by the unheard step


def test_a_forecasting_calibrators_steps_add_in_quadrature_within_a_run_too():
    plain, forecast = measured(1.0, rho=0.2), measured(1.0, rho=0.2)
    forecast.forecast = True
    for a in (plain, forecast):
        for _ in range(4):
            step(a, 0.5, cached=True)
    assert plain.spent == pytest.approx(4 * P * 0.01) and forecast.spent == pytest.approx(2 * P * 0.01)
    tight = measured(P * 0.01 * 5 ** 0.5, rho=0.2)  # room for five such steps in quadrature, two and a bit in a row
    tight.forecast = True
    for _ in range(4):
        step(tight, 0.5, cached=True)
    tight.at(0.5, (0.5, 0.4))
    assert tight.threshold() == pytest.approx(0.5)  # the fifth step's change fits exactly


def test_an_error_at_high_noise_is_carried_further_than_one_at_low_noise():
    low, high = C.propagation(C.PROPAGATION_BAND[0]), C.propagation(C.PROPAGATION_BAND[1])
    assert low == C.propagation(0.0) == C.PROPAGATION["low"] < high == C.propagation(1.0) == C.PROPAGATION["high"]
    band = [C.propagation(C.PROPAGATION_BAND[0] + i * (C.PROPAGATION_BAND[1] - C.PROPAGATION_BAND[0]) / 10)
            for i in range(11)]
    assert band == sorted(band)
    a = measured(0.001, rho=0.2, sigma=0.99, sigmas=(0.99, 0.98))
    a.at(0.99, (0.99, 0.98))
    assert a.threshold() == pytest.approx(0.001 / (C.PROPAGATION["high"] * 0.01 * 0.2))


def test_a_separate_cfg_call_is_half_an_evaluation():
    for forecast in (False, True):
        a = measured(1.0, rho=0.2)
        a.forecast = forecast
        step(a, 0.5, True, share=0.5)
        step(a, 0.5, True, share=0.5)
        assert a.spent == pytest.approx(P * 0.01)


@pytest.mark.parametrize("caps, pattern", [({"max_run": 2}, "CCxCCx"), ({"max_cached": 3}, "CCCxxx"),
                                          ({}, "CCCCCC")])
def test_the_plans_caps_stop_caching_yet_the_step_is_compared(caps, pattern):
    a = measured(1.0, rho=0.2, **caps)
    taken = ""
    for _ in range(6):
        a.at(0.5, (0.5, 0.4))
        allowed = a.threshold() > C.COMPARE
        taken += "C" if allowed else "x"
        a.seen(0.01, cached=allowed)
    assert taken == pattern


def test_the_smallest_step_heard_is_kept_cached_or_not():
    a = measured(0.001, rho=0.2)
    step(a, 0.05, cached=False)
    step(a, 0.01, cached=False, sigma=0.4)
    assert a.estimate()["smallest_step_estimate"] == pytest.approx(C.propagation(0.4) * 0.2 * 0.4 * 0.01)
    assert a.estimate()["estimated_error"] == 0


def test_a_miss_without_a_compared_change_teaches_nothing():
    a = C.ErrorAllowance(1.0)
    a.missed(0.01, 0.0)
    a.missed(float("nan"), 0.05)
    assert a.rho is None and a.estimate()["miss_per_change"] == []


@pytest.mark.parametrize("stages", [("high", "low"), ("lead", "high", "low"), ("low",), ("high",)])
def test_the_stages_shares_add_up_to_the_run_in_quadrature(stages):
    shares = C.error_shares(stages)
    assert set(shares) == set(stages)
    assert C.combined(shares.values()) == pytest.approx(1.0)
    if "lead" in stages:
        assert shares["lead"] == shares["high"] and shares["low"] == pytest.approx(0.5 ** 0.5)


def test_the_model_nodes_share_is_one_of_two_experts():
    assert C.MODEL_SHARE == pytest.approx(C.error_shares(("high", "low"))["high"])


@pytest.mark.parametrize("changes, name", [({"criterion": "fast"}, "criterion"),
                                           ({"error_target": -0.1}, "error_target"),
                                           ({"error_target": 1.5}, "error_target"),
                                           ({"error_target": float("nan")}, "error_target")])
def test_a_bad_criterion_or_target_is_refused_naming_its_input(changes, name):
    with pytest.raises(Wan22InputError) as refused:
        C.CachePlan(**changes).check(8)
    assert refused.value.input_name == name


def test_a_target_of_zero_runs_without_the_cache_and_says_why():
    plan = C.CachePlan(error_target=0.0)
    assert not plan.caches("high") and not plan.caches("low")
    assert "error target is 0" in C.skip_note(plan, "low", 10)
    assert C.CachePlan(criterion="threshold", error_target=0.0).caches("low")  # the threshold ignores it


def test_a_target_below_the_smallest_step_caches_nothing_and_the_report_says_it_is_a_right_answer():
    """A stage whose share of the target is below every step's estimated change caches nothing; its report's note
    says so and names the target that would cache the smallest step (the band check counts it as no miss)."""
    plan = C.CachePlan(error_target=0.01)
    a = C.stage_allowance(plan, "low", 0.5)  # a share of 0.005
    for sigma, diff in ((0.5, 0.05), (0.45, 0.3), (0.4, 0.4)):
        a.at(sigma, (0.5, 0.45, 0.4, 0.3))
        assert a.threshold() < 0.3  # never as large as the steps' changes: nothing may be cached
        a.seen(diff, cached=False)
        a.missed(2.0 * diff, diff)  # a model whose cache misses by twice the change
    estimate = a.estimate()
    assert estimate["estimated_error"] == 0 and estimate["smallest_step_estimate"] > estimate["error_target_share"]
    seen = C.StageSeen(evaluations=3, calls=3, cfg_batching="batched", pass_order=(), block_forwards=24,
                       config="x")
    stats = C.statistics(plan, "low", seen, {"cached_steps": []}, 8, estimate)
    needed = 0.01 * estimate["smallest_step_estimate"] / 0.005
    assert stats["below_smallest_step"] and stats["note"].startswith("cached nothing, rightly")
    assert f"error_target above {needed:.4g}" in stats["note"]
    cached = C.statistics(plan, "low", seen, {"cached_steps": [2]}, 8, estimate)
    assert "below_smallest_step" not in cached and "rightly" not in cached["note"]  # it cached: as before
    nothing_heard = C.stage_allowance(C.CachePlan(error_target=1.0), "low", 0.5).estimate()
    assert C.below_smallest(plan, "low", seen, {"cached_steps": []}, nothing_heard) == {}  # no claim


def test_the_error_criterion_names_its_target_where_cache_dit_names_a_threshold():
    assert backend.describe(C.CachePlan(error_target=0.025), "high") == "DBCache_F1B0_W1I1M0MC3_E0.025"
    assert backend.describe(C.CachePlan(criterion="threshold"), "low") == "DBCache_F1B0_W1I1M20MC3_R0.05"


def test_a_budgets_plan_is_the_plan_with_the_error_criterion_at_its_target():
    plan = C.CachePlan(criterion="threshold", first_compute_blocks=2).with_error_target(0.013, 0.03)
    assert (plan.criterion, plan.error_target, plan.error_budget, plan.first_compute_blocks) == \
        ("error", 0.013, 0.03, 2)


def test_wrappers_on_cache_dits_similarity_come_off_in_turn_each_putting_back_what_it_wrapped(monkeypatch):
    """The parallel plan's weighing and the error criterion's decisions both wrap cache-dit's `similarity`; taking
    the criterion's off leaves the weighing on, taking that off leaves cache-dit's own."""
    class Manager:
        def similarity(self, t1, t2, *, threshold):
            self.compared.append((t1, t2, threshold))
            return t1 < threshold

        def is_separate_cfg_step(self):
            return False

        def get_current_step_residual_diff(self):
            return 0.5

    manager, model, heard = Manager(), type("Model", (), {})(), []
    manager.compared, model._context_manager = [], manager
    monkeypatch.setattr(backend, "is_cached", lambda m: m is model)
    unweigh = backend.weigh_statistic(model, 2.0)
    undecide = backend.decide_by(model, lambda: 0.25, lambda diff, cached: heard.append((diff, cached)))
    assert manager.similarity(1.0, 3.0, threshold=9.0) is False
    assert manager.compared[-1] == (2.0, 6.0, 0.25) and heard == [(0.5, False)]
    undecide()
    assert manager.similarity(1.0, 3.0, threshold=9.0) is True and manager.compared[-1] == (2.0, 6.0, 9.0)
    unweigh()
    assert "similarity" not in vars(manager) and manager.similarity(1.0, 3.0, threshold=9.0) is True
    assert manager.compared[-1] == (1.0, 3.0, 9.0) and len(heard) == 1
    assert backend.decide_by(type("Model", (), {})(), None, None)() is None  # not cached: nothing wrapped
