"""The cache plan, cache-dit's configs made from it, and what one stage's cache did (no ComfyUI)."""

import pytest

from wan22_cachedit.nodes import cache_dit_backend as backend
from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core.errors import Wan22InputError
from wan22_cachedit.nodes.core.report import RunRecord, StepRecord


def test_the_plan_carries_the_wan22_defaults_the_node_and_workflows_read():
    target = C.CachePlan().error_target  # chosen on the tuning bed (tests/in_comfyui/test_quality_choice.py)
    assert C.CachePlan().node_inputs() == {
        "residual_diff_threshold": 0.05, "first_compute_blocks": 1, "last_compute_blocks": 0,
        "max_continuous_cached_steps": 3, "high_warmup_steps": 1, "high_max_cached_steps": -1,
        "low_warmup_steps": 1, "low_max_cached_steps": 20, "calibrator": "none", "criterion": "error",
        "error_target": target}
    # no CFG part: each stage reads it from how ComfyUI batches the prompts when it runs
    assert backend.describe_plan(C.CachePlan()) == (f"high DBCache_F1B0_W1I1M0MC3_E{target:g}, "
                                                     f"low DBCache_F1B0_W1I1M20MC3_E{target:g}")


def test_a_context_config_leaves_the_step_count_unset_and_pairs_cond_first():
    config = backend.config(C.CachePlan(), "low", separate_cfg=True)
    # a context lives exactly one stage: cache-dit's step count (when to restart a reused context) stays unset
    assert config.num_inference_steps is None and config.enable_separate_cfg and not config.cfg_compute_first
    assert backend.describe(C.CachePlan(criterion="threshold"), "low", True) == "DBCache_F1B0_W1I1M20MC3_R0.05_CFG1"
    assert not backend.config(C.CachePlan(), "high", separate_cfg=False).enable_separate_cfg


def test_each_calibrator_is_cache_dits_own_and_named_by_its_own_tag():
    from cache_dit import DMDCalibratorConfig, FoCaCalibratorConfig, TaylorSeerCalibratorConfig

    assert backend.calibrator(C.CachePlan()) is None
    calibrator = backend.calibrator(C.CachePlan(calibrator="taylorseer"))
    assert isinstance(calibrator, TaylorSeerCalibratorConfig) and calibrator.taylorseer_order == 1
    assert isinstance(backend.calibrator(C.CachePlan(calibrator="dmd")), DMDCalibratorConfig)
    assert isinstance(backend.calibrator(C.CachePlan(calibrator="foca")), FoCaCalibratorConfig)
    assert C.CALIBRATORS[:2] == ("none", "taylorseer")  # saved workflows' values keep their places
    for name in C.CALIBRATORS:  # the report's and the canvas's name; DMD's and FoCa's as cache-dit names them
        assert backend.describe(C.CachePlan(calibrator=name), "low").endswith(backend.CALIBRATOR_TAGS[name])
    assert backend.CALIBRATOR_TAGS["dmd"] == "_" + backend.calibrator(C.CachePlan(calibrator="dmd")).strify()
    assert backend.CALIBRATOR_TAGS["foca"] == "_" + backend.calibrator(C.CachePlan(calibrator="foca")).strify()


@pytest.mark.parametrize("plan,input_name", [
    (C.CachePlan(residual_diff_threshold=0.0), "residual_diff_threshold"),
    (C.CachePlan(first_compute_blocks=0), "first_compute_blocks"),
    (C.CachePlan(first_compute_blocks=3, last_compute_blocks=1), "first_compute_blocks"),
    (C.CachePlan(last_compute_blocks=-1), "last_compute_blocks"),
    (C.CachePlan(max_continuous_cached_steps=0), "max_continuous_cached_steps"),
    (C.CachePlan(high=C.ExpertCacheSettings(-1, -1)), "high_warmup_steps"),
    (C.CachePlan(low=C.ExpertCacheSettings(2, -2)), "low_max_cached_steps"),
    (C.CachePlan(calibrator="magic"), "calibrator"),
])
def test_a_plan_the_experts_cannot_take_is_refused_naming_the_input(plan, input_name):
    with pytest.raises(Wan22InputError) as e:
        plan.check(num_layers=4)
    assert e.value.input_name == input_name


def test_what_the_cache_can_skip_is_said_plainly_for_few_steps():
    plan = C.CachePlan(high=C.ExpertCacheSettings(warmup_steps=4, max_cached_steps=-1),
                       low=C.ExpertCacheSettings(warmup_steps=2, max_cached_steps=20))
    assert C.skippable_steps(plan, "high", 2) == 0 and C.skippable_steps(plan, "low", 2) == 0
    assert ("cached nothing: it could skip none of the high-noise expert's 2 steps, as its first 4 are "
            "warm-up") in C.skip_note(plan, "high", 2)
    capped = C.CachePlan(low=C.ExpertCacheSettings(warmup_steps=0, max_cached_steps=0))
    assert "low_max_cached_steps is 0" in C.skip_note(capped, "low", 20)
    assert C.skippable_steps(plan, "high", 26) == 22 and C.skippable_steps(plan, "low", 40) == 20  # low: M20
    assert C.skippable_steps(C.CachePlan(), "high", 2) == 1  # the default warm-up: one computed step


def test_cached_evaluations_are_mapped_back_to_the_run_steps_they_belong_to():
    record = RunRecord(steps=[StepRecord(0, 1.0, "high", 2), StepRecord(1, 0.9, "high", 2),
                              StepRecord(2, 0.8, "low", 2), StepRecord(3, 0.5, "low", 1)])
    record.cache = {"high": {"cached_steps": [3]}, "low": {"cached_steps": [2]}}
    assert record.cached_flags() == [False, True, False, True]


@pytest.mark.parametrize("kind", ["taylorseer", "dmd", "foca"])
def test_a_forecast_read_at_a_computed_step_leaves_the_calibrator_as_it_was(kind):
    """The error criterion reads the calibrator's forecast at computed steps (watch_forecasts), where cache-dit
    never does; FoCa's forecast advances its window, so the read is made with the states kept (peek): a calibrator
    read that way forecasts what an unread one does, bit for bit."""
    import torch
    from cache_dit.caching.cache_contexts.calibrators import Calibrator

    config = backend.calibrator(C.CachePlan(calibrator=kind))
    read, unread = Calibrator(config), Calibrator(config)
    g = torch.Generator().manual_seed(0)
    for step in range(7):
        value = torch.randn(2, 6, 8, generator=g)
        for c in (read, unread):
            c.mark_step_begin()
        if step >= 2:
            backend.peek(read, lambda: read.approximate(name="Bn"))  # the criterion's read, before the update
        for c in (read, unread):
            c.update(value, name="Bn")
    for _ in range(3):  # cached steps: forecasts only
        for c in (read, unread):
            c.mark_step_begin()
        assert torch.equal(read.approximate(name="Bn"), unread.approximate(name="Bn"))


def test_the_bytes_a_cache_will_hold_are_its_tensors_per_prompt_stream_and_a_workers_share_of_them():
    unit = 75_600 * 5_120 * 2  # one hidden state of 720p, 81 frames, in bf16
    common = dict(tokens=75_600, width=5_120, itemsize=2, batch=1)
    assert C.cache_bytes(**common, streams=2, calibrator="none") == 2 * 2 * unit  # the README's 3.1 GB
    assert C.cache_bytes(**common, streams=1, calibrator="taylorseer") == C.HELD_PER_STREAM["taylorseer"] * unit
    assert C.cache_bytes(**common, streams=2, calibrator="none", vace=True) == 3 * 2 * unit  # VACE's fresh hints
    assert C.cache_bytes(**{**common, "batch": 2}, streams=2, calibrator="none") == 2 * 2 * 2 * unit
    # a worker's share: one prompt of the CFG split; the larger shard of a sequence the workers do not divide
    assert C.cache_bytes(**common, streams=2, calibrator="none", prompt_degree=2) == 2 * unit
    assert C.cache_bytes(tokens=9, width=1, itemsize=1, batch=1, streams=1, calibrator="none",
                       sequence_degree=2) == 2 * 5


def test_the_attention_routes_identity_is_every_policys_or_none_and_contexts_merge_into_the_stages_steps():
    from types import SimpleNamespace

    from wan22_cachedit.nodes import attention_route as R

    model, x = SimpleNamespace(patch_size=(1, 2, 2)), SimpleNamespace(shape=(1, 16, 2, 4, 4))
    assert R.route_identity({}, model, x) == R.NONE  # nothing published: one route
    seen = []

    def policy(*, layout, options, model):
        seen.append(layout.seq_len)
        return ("dense",)
    assert R.route_identity({R.POLICIES: {"b": policy, "a": lambda **_: ("x",)}}, model, x) == \
        (("a", ("x",)), ("b", ("dense",)))
    assert seen == [2 * 2 * 2]
    assert R.route_identity({R.POLICIES: {"a": policy, "b": lambda **_: None}}, model, x) is None
    assert R.route_identity({R.POLICIES: {"a": lambda **_: 1 / 0}}, model, x) is None  # raised: vouches for nothing
    assert R.route_identity({R.POLICIES: ["not", "the", "contract"]}, model, x) is None
    first = {"cached_steps": [1, 2], "cfg_cached_steps": [], "residual_diffs": {"1": 0.1, "2": 0.2}}
    second = {"cached_steps": [1], "cfg_cached_steps": [1], "residual_diffs": {"1": 0.3}}
    assert R.merged([(0, first), (5, second)]) == {"cached_steps": [1, 2, 6], "cfg_cached_steps": [6],
                                                   "residual_diffs": {"1": 0.1, "2": 0.2, "6": 0.3}}
