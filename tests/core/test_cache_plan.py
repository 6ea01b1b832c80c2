"""The cache plan, and how many transformer evaluations each expert's context is sized with (no ComfyUI;
the counts are checked against ComfyUI's own samplers in tests/in_comfyui/test_cache_nodes.py)."""

import pytest

from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core.errors import Wan22InputError
from wan22_cachedit.nodes.core.report import RunRecord, StepRecord

HIGH_STAGE = (1.0, 0.98, 0.95, 0.91, 0.88)  # 4 steps ending at the switch
LOW_STAGE = (0.88, 0.6, 0.3, 0.0)  # 3 steps ending at sigma 0


def test_the_plan_carries_the_wan22_defaults_the_node_and_workflows_read():
    assert C.CachePlan().node_inputs() == {
        "residual_diff_threshold": 0.05, "first_compute_blocks": 1, "last_compute_blocks": 0,
        "max_continuous_cached_steps": 3, "high_warmup_steps": 4, "high_max_cached_steps": -1,
        "low_warmup_steps": 2, "low_max_cached_steps": 20, "calibrator": "none"}
    # no CFG part: each stage reads it from how ComfyUI batches the prompts when it runs
    assert C.CachePlan().summary() == ("high DBCache_F1B0_W4I1M0MC3_R0.05, "
                                       "low DBCache_F1B0_W2I1M20MC3_R0.05")


def test_a_context_config_carries_the_stages_evaluations_and_the_cond_first_pairing():
    config = C.CachePlan().db_cache_config("low", 23, separate_cfg=True)
    assert config.num_inference_steps == 23 and config.enable_separate_cfg and not config.cfg_compute_first
    assert config.strify() == "DBCache_F1B0_W2I1M20MC3_R0.05_N23_CFG1"
    assert not C.CachePlan().db_cache_config("high", 2, separate_cfg=False).enable_separate_cfg


def test_taylorseer_is_cache_dits_own_calibrator():
    from cache_dit import TaylorSeerCalibratorConfig

    assert C.CachePlan().calibrator_config() is None
    calibrator = C.CachePlan(calibrator="taylorseer").calibrator_config()
    assert isinstance(calibrator, TaylorSeerCalibratorConfig) and calibrator.taylorseer_order == 1


@pytest.mark.parametrize("plan,input_name", [
    (C.CachePlan(residual_diff_threshold=0.0), "residual_diff_threshold"),
    (C.CachePlan(first_compute_blocks=0), "first_compute_blocks"),
    (C.CachePlan(first_compute_blocks=3, last_compute_blocks=1), "first_compute_blocks"),
    (C.CachePlan(last_compute_blocks=-1), "last_compute_blocks"),
    (C.CachePlan(max_continuous_cached_steps=0), "max_continuous_cached_steps"),
    (C.CachePlan(high=C.ExpertCacheSettings(-1, -1)), "high_warmup_steps"),
    (C.CachePlan(low=C.ExpertCacheSettings(2, -2)), "low_max_cached_steps"),
    (C.CachePlan(calibrator="foca"), "calibrator"),
])
def test_a_plan_the_experts_cannot_take_is_refused_naming_the_input(plan, input_name):
    with pytest.raises(Wan22InputError) as e:
        plan.check(num_layers=4)
    assert e.value.input_name == input_name


@pytest.mark.parametrize("sampler,high,low", [
    ("euler", [1, 1, 1, 1], [1, 1, 1]),
    ("uni_pc", [1, 1, 1, 1], [1, 1, 1]),
    ("heun", [2, 2, 2, 2], [2, 2, 1]),  # one evaluation on the last step, which ends at sigma 0
    ("dpmpp_2s_ancestral", [2, 2, 2, 2], [2, 2, 1]),
    ("seeds_3", [3, 3, 3, 3], [3, 3, 1]),
    ("heunpp2", [3, 3, 2, 1], [3, 2, 1]),  # looks two sigmas ahead within its stage
    ("sa_solver_pece", [1, 2, 2, 2], [1, 2, 2]),
])
def test_evaluations_per_step_follow_each_samplers_own_rule(sampler, high, low):
    assert C.evaluations_per_step(sampler, HIGH_STAGE) == high
    assert C.evaluations_per_step(sampler, LOW_STAGE) == low


@pytest.mark.parametrize("sampler,fragment", [("dpm_adaptive", "chooses its step sizes"),
                                              ("my_custom_sampler", "does not know how many")])
def test_a_sampler_whose_calls_cannot_be_known_is_refused_with_the_cache_on(sampler, fragment):
    with pytest.raises(Wan22InputError) as e:
        C.evaluations_per_step(sampler, HIGH_STAGE)
    assert e.value.input_name == "sampler" and fragment in str(e.value) and "turn Cache-DiT off" in str(e.value)


def test_what_the_cache_can_skip_is_said_plainly_for_few_steps():
    plan = C.CachePlan()
    assert C.skippable_steps(plan, "high", 2) == 0 and C.skippable_steps(plan, "low", 2) == 0
    assert ("run without the cache: it could skip none of the high-noise expert's 2 steps, as its first 4 are "
            "warm-up") in C.skip_note(plan, "high", 2)
    capped = C.CachePlan(low=C.ExpertCacheSettings(warmup_steps=0, max_cached_steps=0))
    assert "low_max_cached_steps is 0" in C.skip_note(capped, "low", 20)
    assert C.skippable_steps(plan, "high", 26) == 22 and C.skippable_steps(plan, "low", 40) == 20  # low: M20


def test_cached_evaluations_are_mapped_back_to_the_run_steps_they_belong_to():
    record = RunRecord(split=(2, 2), steps=[StepRecord(0, 1.0, "high", 2), StepRecord(1, 0.9, "high", 2),
                                            StepRecord(2, 0.8, "low", 2), StepRecord(3, 0.5, "low", 1)])
    record.cache = {"high": {"cached_steps": [3]}, "low": {"cached_steps": [2]}}
    assert record.cached_flags() == [False, True, False, True]
