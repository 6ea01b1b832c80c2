"""The error criterion's arithmetic, without ComfyUI: each step's estimate from the run's own statistics, the
stages' shares of the run's target, and what a call may cache."""

import math

import pytest

from wan22_cachedit.nodes import cache_dit_backend as backend
from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core.errors import Wan22InputError

SIGMAS = (1.0, 0.9, 0.7, 0.4, 0.0)


def test_a_steps_sigma_gap_is_the_stride_to_the_next_sigma_also_between_sigmas_and_at_the_end():
    assert C.sigma_gap(0.9, SIGMAS) == pytest.approx(0.2)
    assert C.sigma_gap(0.8, SIGMAS) == pytest.approx(0.1)  # a second-order sampler's evaluation inside a step
    assert C.sigma_gap(0.4, SIGMAS) == pytest.approx(0.4)  # the last step: to 0
    assert C.sigma_gap(0.4, SIGMAS[:4]) == pytest.approx(0.4)  # a stage's slice ending above 0: past it, to 0


def test_the_gain_rises_from_low_to_high_noise_over_its_band_only():
    low, high = C.error_gain(0.0), C.error_gain(1.0)
    assert low == C.error_gain(C.GAIN_BAND[0]) == C.ERROR_GAIN["low"]
    assert high == C.error_gain(C.GAIN_BAND[1]) == C.ERROR_GAIN["high"] > low
    band = [C.error_gain(C.GAIN_BAND[0] + i * (C.GAIN_BAND[1] - C.GAIN_BAND[0]) / 10) for i in range(11)]
    assert band == sorted(band)


def allowance(target, sigma=0.5, sigmas=(0.5, 0.4)):
    a = C.ErrorAllowance(target)
    a.at(sigma, sigmas)
    return a


def test_a_target_of_zero_caches_nothing_and_a_threshold_never_reads_as_always():
    assert allowance(0.0).threshold() == 0.0
    assert allowance(100.0).threshold() == 0.99  # cache-dit reads 1.0 or more as "cache whatever changed"


def test_a_call_may_cache_while_its_estimate_fits_what_is_left():
    a = allowance(0.01)  # gain 2 at sigma 0.5, gap 0.1: an estimate of 0.2 x the residual change
    assert a.threshold() == pytest.approx(0.01 / (C.error_gain(0.5) * 0.1))
    a.seen(0.03, cached=True)
    assert a.spent == pytest.approx(0.2 * 0.03)
    assert a.threshold() == pytest.approx((0.01 - 0.006) / 0.2)  # the run in progress adds up


def test_cached_steps_in_a_row_add_up_and_runs_parted_by_a_computed_step_add_in_quadrature():
    a = C.ErrorAllowance(1.0)
    for cached in (True, True, False, True):
        a.at(0.5, (0.5, 0.4))
        a.seen(0.05, cached=cached)
    # two in a row: 0.01 + 0.01; then a computed step; then one: 0.01
    assert a.spent == pytest.approx(math.sqrt(0.02 ** 2 + 0.01 ** 2))
    computed_unheard = C.ErrorAllowance(1.0)  # a computed step cache-dit never compared (warm-up) parts them too
    for heard in (True, None, True):
        computed_unheard.at(0.5, (0.5, 0.4))
        if heard:
            computed_unheard.seen(0.05, cached=True)
    assert computed_unheard.spent == pytest.approx(math.sqrt(2) * 0.01)


def test_a_separate_cfg_call_is_half_an_evaluation():
    a = C.ErrorAllowance(1.0)
    a.at(0.5, (0.5, 0.4))
    a.seen(0.05, cached=True, share=0.5)
    a.at(0.5, (0.5, 0.4))
    a.seen(0.05, cached=True, share=0.5)
    assert a.spent == pytest.approx(0.01)


def test_the_smallest_step_heard_is_kept_cached_or_not():
    a = C.ErrorAllowance(0.001)
    a.at(0.5, (0.5, 0.4))
    a.seen(0.05, cached=False)
    a.at(0.4, (0.5, 0.4))
    a.seen(0.01, cached=False)
    assert a.estimate()["smallest_step_estimate"] == pytest.approx(C.error_gain(0.4) * 0.4 * 0.01)
    assert a.estimate()["estimated_error"] == 0


@pytest.mark.parametrize("stages", [("high", "low"), ("lead", "high", "low"), ("low",), ("high",)])
def test_the_stages_shares_add_up_to_the_run_as_independent_errors_do(stages):
    shares = C.error_shares(stages)
    assert set(shares) == set(stages)
    assert sum(s * s for s in shares.values()) == pytest.approx(1.0)
    if "lead" in stages:
        assert shares["lead"] == shares["high"] and shares["low"] == pytest.approx(math.sqrt(0.5))


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
