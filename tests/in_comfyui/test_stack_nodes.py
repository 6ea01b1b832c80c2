"""The nodes people stack on a Wan MODEL and the conditioning they build, each with the cache: it works (with
nothing cached, the output equals ComfyUI's own graph with the same node) or it is refused before anything
runs, naming the node and what to do, with nothing left on the experts."""

import pytest
import torch

from .cache_state import leftovers_of_the_cache
from .prompts import (CACHING, FINAL, NEVER, diffusion_models, equals_native, failed_at_run, latent_of, report_of,
                      run_ok, stack_graphs)

def refused(comfyui, prompt, *words):
    executor = comfyui.new_executor()
    result = comfyui.run(prompt, executor=executor)
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert message.startswith("enabled: the high-noise expert is also run by"), message
    assert all(w in message for w in words), message
    for model in diffusion_models(comfyui, executor=executor).values():
        assert leftovers_of_the_cache(model) == []
    return message


# --- ComfyUI's own nodes ---

@pytest.mark.parametrize("fmt, weight_dtype", [("fp8_scaled", "default"), ("fp8_comfy_quant", "default"),
                                               ("fp16", "fp8_e4m3fn")])
def test_fp8_experts_work_with_the_cache(comfyui, tiny_models, fmt, weight_dtype):
    """ComfyUI's fp8 files (scaled, comfy_quant) and its fp8 weight_dtype on Load Diffusion Model."""
    pair = stack_graphs(tiny_models, NEVER, fmt=fmt)
    for prompt in pair:
        for loader_id in ("10", "11"):
            prompt[loader_id]["inputs"]["weight_dtype"] = weight_dtype
    equals_native(comfyui, *pair)
    ours, _ = stack_graphs(tiny_models, CACHING, fmt=fmt)
    for loader_id in ("10", "11"):
        ours[loader_id]["inputs"]["weight_dtype"] = weight_dtype
    report = report_of(run_ok(comfyui, ours))
    assert report["cache"]["high"]["cached_steps"] and report["cache"]["low"]["cached_steps"]


def test_easycache_and_lazycache_on_the_same_expert_are_refused_by_name(comfyui, tiny_models):
    for kind in ("EasyCache", "LazyCache"):
        ours, _ = stack_graphs(tiny_models, {}, class_type=kind, reuse_threshold=0.2, start_percent=0.15,
                               end_percent=0.95, verbose=False)
        refused(comfyui, ours, "ComfyUI's EasyCache or LazyCache", "set enabled to false", "remove that node")


def test_context_windows_are_refused_by_name(comfyui, tiny_models):
    ours, _ = stack_graphs(tiny_models, {}, class_type="WanContextWindowsManual", context_length=5,
                           context_overlap=4, context_schedule="standard_uniform", context_stride=1, closed_loop=False,
                           fuse_method="pyramid", freenoise=False, retain_first_frame=False,
                           split_conds_to_windows=False)
    refused(comfyui, ours, "context windows (a Context Windows node")


def test_the_multigpu_cfg_split_with_one_device_equals_native(comfyui, tiny_models):
    """On one device the split makes no clones: nothing to refuse (with clones on other devices it is)."""
    equals_native(comfyui, *stack_graphs(tiny_models, NEVER, class_type="MultiGPU_WorkUnits", max_gpus=2))


# --- conditioning as people build it ---

def conditioned(prompt, kind, at=0.45):
    """The prompt with a second text node "33", and its positive prompt built of both texts by `kind`: two
    entries at once (combine), or one after the other (timesteps: the first until `at` of the way; at 0.5 the two
    ranges meet on a step of these runs, which then has both)."""
    p = dict(prompt)
    p["33"] = {**p["3"], "inputs": {**p["3"]["inputs"], "prompt": "a dog runs on the beach"}}
    if kind == "combine":
        first, second = ["3", 0], ["33", 0]
    else:
        p["35"] = {"class_type": "ConditioningSetTimestepRange", "inputs": {"conditioning": ["3", 0], "start": 0.0,
                                                                            "end": at}}
        p["36"] = {"class_type": "ConditioningSetTimestepRange", "inputs": {"conditioning": ["33", 0],
                                                                            "start": at, "end": 1.0}}
        first, second = ["35", 0], ["36", 0]
    p["34"] = {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": first, "conditioning_2": second}}
    for node_id, node in p.items():
        if node["class_type"] in ("Wan22TwoStageSampler", "KSamplerAdvanced"):
            p[node_id] = {**node, "inputs": {**node["inputs"], "positive": ["34", 0]}}
    return p


def test_combined_and_timestep_range_conditioning_run_cached_and_equal_native_with_nothing_cached(comfyui,
                                                                                                tiny_models):
    for kind in ("combine", "timesteps"):
        ours, native = stack_graphs(tiny_models, NEVER)
        equals_native(comfyui, conditioned(ours, kind), conditioned(native, kind))
        latents = []
        for seed in (3, 4, 3):
            ours, _ = stack_graphs(tiny_models, CACHING, run={"seed": seed})
            report = report_of(run_ok(comfyui, conditioned(ours, kind)))
            assert report["cache"]["high"]["cached_steps"], kind
            latents.append(latent_of(comfyui, FINAL["ours"]))
        assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1]), kind


def test_several_entries_of_a_prompt_in_separate_calls_are_refused_with_that_reason(comfyui, tiny_models,
                                                                                     monkeypatch):
    """When memory is short, ComfyUI runs the entries of a prompt in calls of their own: not a memory change."""
    import comfy.model_patcher

    monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, device: 1024)
    ours, _ = stack_graphs(tiny_models, CACHING)
    message = failed_at_run(comfyui, conditioned(ours, "combine"))
    assert message.startswith("enabled: Cache-DiT cannot follow the high-noise stage: the positive prompt's "
                              "conditioning has several entries (ConditioningCombine"), message
    assert "memory" not in message and "set enabled to false" in message


def test_timestep_ranges_meeting_on_a_step_are_refused_with_that_reason(comfyui, tiny_models):
    ours, _ = stack_graphs(tiny_models, CACHING)
    message = failed_at_run(comfyui, conditioned(ours, "timesteps", at=0.5))
    assert "the positive prompt's conditioning has several entries" in message, message
    assert "ConditioningSetTimestepRange ranges that overlap" in message and "memory" not in message
