"""KJNodes' Wan nodes (an unmodified copy, linked in where it is there) on the experts, with the cache: each
works (with nothing cached, equal to ComfyUI's own graph with the same node; cached, it caches and leaves
nothing) or fails as it fails without the pack."""

import sys
import types

import pytest
import torch

from .cache_state import leftovers_of_the_cache
from .prompts import CACHING, NEVER, diffusion_models, equals_native, failed_at_run, report_of, run_ok, stack_graphs

LAYERS = 4
OBJECT_PATCHES = {  # nodes that patch the blocks' modules (or the rope embedder) in place
    "WanVideoEnhanceAVideoKJ": {"latent": ["4", 0], "weight": 2.0},
    "ApplyRifleXRoPE_WanVideo": {"latent": ["4", 0], "k": 6},
    "WanChunkFeedForward": {"chunks": 2, "dim_threshold": 1024},
}


def cached_run(comfyui, ours) -> dict:
    report = report_of(run_ok(comfyui, ours))
    assert all(report["cache"][role]["cached_steps"] for role in ("high", "low"))
    for model in diffusion_models(comfyui).values():
        assert leftovers_of_the_cache(model) == [] and len(model.blocks) == LAYERS
    return report


@pytest.mark.parametrize("kind", sorted(OBJECT_PATCHES))
def test_kjnodes_wan_model_patches_work_with_the_cache(kj_comfyui, tiny_models, kind):
    run = {"length": 5}  # two latent frames: Enhance-A-Video weighs attention across frames
    equals_native(kj_comfyui, *stack_graphs(tiny_models, NEVER, run, class_type=kind, **OBJECT_PATCHES[kind]))
    cached_run(kj_comfyui, stack_graphs(tiny_models, CACHING, run, class_type=kind, **OBJECT_PATCHES[kind])[0])


@pytest.fixture
def sage_standin(monkeypatch):
    """`sageattention` as KJNodes imports it, computing plain attention in the layout sage takes: the real one
    needs CUDA. Records each call."""
    calls = []

    def sageattn(q, k, v, is_causal=False, attn_mask=None, tensor_layout="NHD"):
        calls.append(tuple(q.shape))
        q, k, v = (t.float() for t in (q, k, v))  # KJNodes hands sage half precision; CPU attention runs fp32
        if tensor_layout == "NHD":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return out.transpose(1, 2) if tensor_layout == "NHD" else out

    module = types.ModuleType("sageattention")
    module.sageattn = sageattn
    monkeypatch.setitem(sys.modules, "sageattention", module)
    return calls


def test_kjnodes_sage_attention_patch_runs_in_every_computed_block(kj_comfyui, tiny_models, sage_standin):
    sage = {"class_type": "PathchSageAttentionKJ", "sage_attention": "auto"}
    equals_native(kj_comfyui, *stack_graphs(tiny_models, NEVER, **dict(sage)))
    sage_standin.clear()
    report = cached_run(kj_comfyui, stack_graphs(tiny_models, CACHING, **dict(sage))[0])
    forwards = sum(report["cache"][role]["block_forwards"] for role in ("high", "low"))
    assert len(sage_standin) == 2 * forwards  # self- and cross-attention of every block computed, no other


def test_kjnodes_skip_layer_guidance_fails_as_it_fails_on_comfyuis_own_wan_graph(kj_comfyui, tiny_models):
    """It needs inputs that only KJNodes' own TeaCache passes to block patches; ComfyUI's loop does not."""
    slg = {"class_type": "SkipLayerGuidanceWanVideo", "blocks": "1", "start_percent": 0.0, "end_percent": 1.0}
    ours, native = stack_graphs(tiny_models, CACHING, **dict(slg))
    native["16"]["inputs"]["end_at_step"] = native["17"]["inputs"]["start_at_step"] = 5
    theirs = failed_at_run(kj_comfyui, native)
    assert "only works with TeaCacheKJ" in theirs
    assert failed_at_run(kj_comfyui, ours) == theirs
    for model in diffusion_models(kj_comfyui).values():
        assert leftovers_of_the_cache(model) == []


def test_kjnodes_sage_attention_patch_runs_inside_the_parallel_split_equal_to_one_process(
        kj_comfyui, tiny_models, parallel_experts, sage_standin):
    """KJNodes' sage override goes to the parallel plan's workers and runs there as the split's inner
    attention (its stand-in pickled by value with it): the result equals one process with the same patch."""
    pytest.importorskip("ray", reason="the parallel plan needs Ray (requirements-dev.txt)")
    pytest.importorskip("yunchang", reason="the parallel plan needs yunchang (requirements-dev.txt)")
    from . import prompts as P
    from .test_parallel import RUN, near_one_process, with_plan

    high, low = parallel_experts[("t2v", "high")], parallel_experts[("t2v", "low")]
    prompt = P.our_prompt(P.on_each_expert(P.bridged(high, low), "PathchSageAttentionKJ", sage_attention="auto"),
                          P.text_folder(tiny_models), **{**RUN, "cfg": (1.0, 1.0)})
    run_ok(kj_comfyui, prompt)
    alone = P.latent_of(kj_comfyui, "5")
    assert sage_standin, "the sage patch should run in one process"
    sage_standin.clear()
    run_ok(kj_comfyui, with_plan(prompt))
    assert near_one_process(P.latent_of(kj_comfyui, "5"), alone)
    assert not sage_standin, "with the plan, the workers run it, not this process"
