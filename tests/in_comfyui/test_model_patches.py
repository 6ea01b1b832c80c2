"""What other nodes put on a Wan MODEL reaches every block the cache computes, as it reaches every block of
ComfyUI's own loop: an attention override sees each computed block with its own index, a block replace
patch runs on its block, and with nothing cached the output is ComfyUI's own graph with the same node."""

import itertools

import torch

from .cache_state import leftovers
from .prompts import (FINAL, bridged, diffusion_models, expert_files, latent_of, native_prompt, on_each_expert,
                      our_prompt, report_of, run_ok, text_folder)

RUN = dict(sampler="euler", steps=10, flow_shift=5.0, seed=6, width=32, height=32, length=1)
CACHING = {"residual_diff_threshold": 0.9, "high_warmup_steps": 1, "low_warmup_steps": 1}
NEVER = {"residual_diff_threshold": 0.001, "high_warmup_steps": 1, "low_warmup_steps": 1}  # installed, caches none
LAYERS = 4


def calls_of(records):
    """The block indices each transformer call's attention saw, call by call (records: (call, index, count))."""
    return [[index for _, index, _ in group] for _, group in itertools.groupby(records, key=lambda r: r[0])]


def equal_to_native(comfyui, tiny, cache, class_type, **inputs):
    high, low = expert_files(tiny)
    result = run_ok(comfyui, on_each_expert(our_prompt(bridged(high, low), text_folder(tiny), cache=cache, **RUN),
                                            class_type, **inputs))
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(high, low, text_folder(tiny), switch=report_of(result)["split"]["high"], **RUN)
    run_ok(comfyui, on_each_expert(native, class_type, **inputs))
    return result, torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_an_attention_override_sees_every_computed_block_with_its_own_index(comfyui, tiny_models, probe_nodes):
    high, low = expert_files(tiny_models)
    result = run_ok(comfyui, on_each_expert(our_prompt(bridged(high, low), text_folder(tiny_models), cache=CACHING,
                                                       **RUN), "Wan22TestRecordAttention"))
    report = report_of(result)
    calls = calls_of(probe_nodes["attention"])
    computed = sorted(2 * list(range(LAYERS)))
    assert all(sorted(c) in (computed, [0, 0]) for c in calls), calls[:3]  # all blocks, or the first block only
    assert {count for _, _, count in probe_nodes["attention"]} == {LAYERS}
    forwards = sum(report["cache"][role]["block_forwards"] for role in ("high", "low"))
    cached = sum(len(report["cache"][role]["cached_steps"]) + len(report["cache"][role]["cfg_cached_steps"])
                 for role in ("high", "low"))
    assert cached and len(probe_nodes["attention"]) == 2 * forwards
    assert sum(sorted(c) == [0, 0] for c in calls) == cached
    for model in diffusion_models(comfyui).values():
        assert leftovers(model) == []


def test_with_an_attention_override_nothing_cached_and_cache_off_equal_native(comfyui, tiny_models, probe_nodes):
    result, equal = equal_to_native(comfyui, tiny_models, NEVER, "Wan22TestRecordAttention")
    report = report_of(result)
    assert equal and all(report["cache"][role]["cached"] and not report["cache"][role]["cached_steps"]
                         for role in ("high", "low"))
    result, equal = equal_to_native(comfyui, tiny_models, {"enabled": False}, "Wan22TestRecordAttention")
    assert equal and report_of(result)["cache"]["plan"] is None


def test_a_block_replace_patch_runs_on_its_block_in_the_cached_loop(comfyui, tiny_models, probe_nodes):
    result, equal = equal_to_native(comfyui, tiny_models, NEVER, "Wan22TestReplaceBlock", block=2)
    report = report_of(result)
    assert equal and all(report["cache"][role]["cached"] and not report["cache"][role]["cached_steps"]
                         for role in ("high", "low"))
    assert set(probe_nodes["replace"]) == {2}
    probe_nodes["replace"].clear()
    high, low = expert_files(tiny_models)
    result = run_ok(comfyui, on_each_expert(our_prompt(bridged(high, low), text_folder(tiny_models), cache=CACHING,
                                                       **RUN), "Wan22TestReplaceBlock", block=2))
    report = report_of(result)
    computed = sum(report["cache"][role]["block_forwards"] for role in ("high", "low"))
    cached = sum(len(report["cache"][role]["cached_steps"]) + len(report["cache"][role]["cfg_cached_steps"])
                 for role in ("high", "low"))
    calls = sum(report["transformer_calls"].values())
    assert cached and len(probe_nodes["replace"]) == calls - cached  # once per call that computed block 2
    assert computed == LAYERS * (calls - cached) + cached
