"""Cache-DiT on the experts: contexts sized per run, clean removal, repeatability, real savings.
Real cache-dit on tiny 8-layer experts (no ComfyUI)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from diffusers import WanTransformer3DModel

from devtools import tiny_wan
from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core import denoise as D
from wan22_cachedit.nodes.core import schedule as S
from wan22_cachedit.nodes.core.errors import Wan22InputError
from .handles import handle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = 8


def fresh_pair():
    return tiny_wan.make_expert("t2v", 1, num_layers=LAYERS), tiny_wan.make_expert("t2v", 2, num_layers=LAYERS)


@pytest.fixture
def pair():
    high, low = fresh_pair()
    yield high, low
    for module in (high, low):
        C.remove(module)


def inputs(seed=0, shape=(1, 16, 3, 16, 16)):
    g = torch.Generator().manual_seed(seed)
    return D.DenoiseInputs(positive=torch.randn(1, 24, 4096, generator=g), negative=torch.randn(1, 24, 4096, generator=g),
                           noise=torch.randn(shape, generator=g))


def schedule_for(experts, sampler="unipc", steps=20, shift=12.0, custom=None):
    return S.build_schedule(sampler=sampler, steps=steps, flow_shift=shift, has_high=experts.has_high,
                            has_low=experts.has_low, model_default=0.875, custom_ratio=custom)


def run(experts, seed=0, cfg=(4.0, 3.0), shape=(1, 16, 3, 16, 16), **schedule_kw):
    return D.denoise(experts, schedule_for(experts, **schedule_kw), inputs(seed, shape), *cfg)


def test_each_context_is_sized_with_its_experts_share_of_this_run(pair):
    experts = handle(*pair, plan=C.CachePlan())
    small = (1, 16, 1, 8, 8)
    _, first = run(experts, steps=40, shift=5.0, shape=small)
    sizes_first = [C.context_sizes(m) for m in pair]  # read from cache-dit, not from our bookkeeping
    _, second = run(experts, steps=40, shift=12.0, shape=small)
    sizes_second = [C.context_sizes(m) for m in pair]
    assert first.split == (17, 23) and sizes_first == [[17], [23]]
    assert second.split == (26, 14) and sizes_second == [[26], [14]]
    assert second.cache["high"]["context_steps"] == [26] and second.cache["high"]["config"].endswith("_N26_CFG1")


@pytest.mark.parametrize("loaded", ["low", "high"])
def test_a_single_expert_carries_the_cache_alone_and_the_missing_one_is_untouched(pair, loaded):
    high, low = pair
    experts = handle(high if loaded == "high" else None, low if loaded == "low" else None, plan=C.CachePlan())
    other = low if loaded == "high" else high
    _, record = run(experts, sampler="euler", steps=12)
    target = high if loaded == "high" else low
    assert C.context_sizes(target) == [12] and C.is_cached(target)
    assert C.leftovers(other) == [] and not C.is_cached(other)
    assert set(record.cache) == {loaded}


def test_disabling_unhooks_everything_and_matches_a_process_that_never_cached(pair, tmp_path):
    high, low = pair
    class_attrs = set(vars(WanTransformer3DModel))
    run(handle(high, low, plan=C.CachePlan()), seed=4)
    assert C.is_cached(high) and C.is_cached(low)
    uncached, record = run(handle(high, low, plan=None), seed=4)
    assert C.leftovers(high) == [] and C.leftovers(low) == []
    assert set(vars(WanTransformer3DModel)) == class_attrs  # no class was patched
    assert record.cache["high"]["block_forwards"] == record.cache["high"]["block_forwards_without_cache"]

    script = f"""
import sys, torch
sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
from devtools.paths import import_pack
import_pack()
from core import test_cache as T
experts = T.handle(*T.fresh_pair())
out, _ = T.run(experts, seed=4)
torch.save(out, {str(tmp_path / 'never_cached.pt')!r})
assert T.C.leftovers(experts.high_noise) == [] and T.C.leftovers(experts.low_noise) == []
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.equal(uncached, torch.load(tmp_path / "never_cached.pt"))


def test_cached_runs_with_seeds_a_b_a_repeat_bit_for_bit(pair):
    experts = handle(*pair, plan=C.CachePlan())
    a1, ra = run(experts, seed=1)
    b, _ = run(experts, seed=2)
    a2, ra2 = run(experts, seed=1)
    assert torch.equal(a1, a2) and not torch.equal(a1, b)
    assert ra.cache == ra2.cache


def test_it_caches_and_the_report_agrees_with_cache_dits_summary(pair):
    import cache_dit

    experts = handle(*pair, plan=C.CachePlan())
    reference, _ = run(experts.replace(cache_plan=None), seed=3)
    cached, record = run(experts, seed=3)
    skipped = LAYERS - 1 - 0
    for role, module in zip(("high", "low"), pair):
        stats = record.cache[role]
        summaries = [s for s in cache_dit.summary(module, details=False, logging=False) if s.cache_options]
        assert summaries and all(s.cached_steps == summaries[0].cached_steps for s in summaries)
        summary = summaries[0]
        assert stats["cached_steps"] == sorted(summary.cached_steps) and stats["cached_steps"]
        assert stats["cfg_cached_steps"] == sorted(summary.cfg_cached_steps)
        assert stats["block_forwards"] < stats["block_forwards_without_cache"]
        cached_forwards = len(summary.cached_steps) + len(summary.cfg_cached_steps)
        assert stats["block_forwards"] == stats["block_forwards_without_cache"] - cached_forwards * skipped
        assert all(v <= stats["threshold"] for k, v in stats["residual_diffs"].items()
                   if int(k) in stats["cached_steps"])
    # The measured table in shared/reference/cache-dit.md: 13/7 split, 110/56 block calls of 208/112.
    assert record.split == (13, 7)
    assert (record.cache["high"]["block_forwards"], record.cache["low"]["block_forwards"]) == (110, 56)
    rel_l2 = ((cached - reference).norm() / reference.norm()).item()
    assert 0 < rel_l2 < 0.05
    flags = record.cached_flags()
    assert sum(flags) == len(record.cache["high"]["cached_steps"]) + len(record.cache["low"]["cached_steps"])


def test_separate_cfg_follows_how_each_expert_is_called(pair):
    experts = handle(*pair, plan=C.CachePlan())
    _, record = run(experts, cfg=(4.0, 1.0))
    assert record.cache["high"]["config"].endswith("_CFG1")
    assert record.cache["low"]["config"].endswith("_N7_CFG0")
    assert record.cache["low"]["cached_steps"] and record.cache["low"]["cfg_cached_steps"] == []


def test_an_expert_with_no_steps_is_neither_refreshed_nor_run(pair):
    experts = handle(*pair, plan=C.CachePlan())
    run(experts, steps=12)
    assert C.context_sizes(pair[0]) == [8]
    _, record = run(experts, steps=12, custom=1.0)  # unipc: every step below 1000 -> all low
    assert record.split == (0, 12)
    assert C.context_sizes(pair[0]) == [8] and "config" not in record.cache["high"]
    assert record.cache["high"]["block_forwards"] == 0 and C.context_sizes(pair[1]) == [12]


def test_a_changed_plan_is_reinstalled(pair):
    experts = handle(*pair, plan=C.CachePlan())
    run(experts, steps=8)
    stricter = C.CachePlan(residual_diff_threshold=0.05, high=C.ExpertCacheSettings(1, 2))
    _, record = run(experts.replace(cache_plan=stricter), steps=8)
    context = pair[0]._context_manager.get_context(pair[0]._context_names[0])
    assert context.cache_config.residual_diff_threshold == 0.05 and context.cache_config.max_warmup_steps == 1
    assert record.cache["high"]["config"].startswith("DBCache_F1B0_W1I1M2MC3_R0.05")


def test_a_failed_run_leaves_a_state_the_next_run_recovers_from(pair):
    experts = handle(*pair, plan=C.CachePlan())
    clean, _ = run(experts, seed=9)

    class Interrupted(BaseException):
        pass

    def stop(i, n):
        if i == 9:
            raise Interrupted()

    with pytest.raises(Interrupted):
        D.denoise(experts, schedule_for(experts), inputs(9), 4.0, 3.0, before_step=stop)
    again, _ = run(experts, seed=9)
    assert torch.equal(clean, again)
    assert all(not m._forward_hooks for b in pair for m in b.modules())  # the block counter's hooks are gone


@pytest.mark.parametrize("plan,input_name", [
    (C.CachePlan(first_compute_blocks=8), "first_compute_blocks"),
    (C.CachePlan(first_compute_blocks=4, last_compute_blocks=4), "first_compute_blocks"),
    (C.CachePlan(residual_diff_threshold=0.0), "residual_diff_threshold"),
    (C.CachePlan(max_continuous_cached_steps=0), "max_continuous_cached_steps"),
    (C.CachePlan(low=C.ExpertCacheSettings(2, -5)), "low_max_cached_steps"),
])
def test_a_plan_the_experts_cannot_take_is_refused_naming_the_input(plan, input_name):
    with pytest.raises(Wan22InputError) as e:
        plan.check(LAYERS)
    assert e.value.input_name == input_name


def test_the_plan_is_a_printable_comparable_value():
    assert C.CachePlan() == C.CachePlan() and hash(C.CachePlan()) == hash(C.CachePlan())
    assert C.CachePlan().strify("high").startswith("DBCache_F1B0_W4I1M0MC3_R0.24")
    assert C.CachePlan().strify("low").startswith("DBCache_F1B0_W2I1M20MC3_R0.24")
    assert json.dumps(C.CachePlan().summary())
