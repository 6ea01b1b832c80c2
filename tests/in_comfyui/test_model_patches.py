"""What other nodes put on a Wan MODEL reaches every block the cache computes, as it reaches every block of
ComfyUI's own loop: an attention override sees each computed block with its own index, a block replace
patch runs on its block, and with nothing cached the output is ComfyUI's own graph with the same node."""

import itertools

from .cache_state import leftovers_of_the_cache
from .prompts import (CACHING, NEVER, cached_evaluations, diffusion_models, equals_native, report_of, run_ok,
                      stack_graphs)

LAYERS = 4


def calls_of(records):
    """The block indices each transformer call's attention saw, call by call (records: (call, index, count))."""
    return [[index for _, index, _ in group] for _, group in itertools.groupby(records, key=lambda r: r[0])]


def test_an_attention_override_sees_every_computed_block_with_its_own_index(comfyui, tiny_models, probe_nodes):
    report = report_of(run_ok(comfyui, stack_graphs(tiny_models, CACHING, class_type="Wan22TestRecordAttention")[0]))
    calls = calls_of(probe_nodes["attention"])
    computed = sorted(2 * list(range(LAYERS)))
    assert all(sorted(c) in (computed, [0, 0]) for c in calls), calls[:3]  # all blocks, or the first block only
    assert {count for _, _, count in probe_nodes["attention"]} == {LAYERS}
    forwards = sum(report["cache"][role]["block_forwards"] for role in ("high", "low"))
    cached = cached_evaluations(report)
    assert cached and len(probe_nodes["attention"]) == 2 * forwards
    assert sum(sorted(c) == [0, 0] for c in calls) == cached
    for model in diffusion_models(comfyui).values():
        assert leftovers_of_the_cache(model) == []


def test_with_an_attention_override_nothing_cached_and_cache_off_equal_native(comfyui, tiny_models, probe_nodes):
    equals_native(comfyui, *stack_graphs(tiny_models, NEVER, class_type="Wan22TestRecordAttention"))
    off = equals_native(comfyui, *stack_graphs(tiny_models, {"enabled": False}, class_type="Wan22TestRecordAttention"),
                        nothing_cached=False)
    assert off["cache"]["plan"] is None


def test_a_block_replace_patch_runs_on_its_block_in_the_cached_loop(comfyui, tiny_models, probe_nodes):
    equals_native(comfyui, *stack_graphs(tiny_models, NEVER, class_type="Wan22TestReplaceBlock", block=2))
    assert set(probe_nodes["replace"]) == {2}
    probe_nodes["replace"].clear()
    report = report_of(run_ok(comfyui, stack_graphs(tiny_models, CACHING, class_type="Wan22TestReplaceBlock",
                                                    block=2)[0]))
    computed = sum(report["cache"][role]["block_forwards"] for role in ("high", "low"))
    cached = cached_evaluations(report)
    calls = sum(report["transformer_calls"].values())
    assert cached and len(probe_nodes["replace"]) == calls - cached  # once per call that computed block 2
    assert computed == LAYERS * (calls - cached) + cached
