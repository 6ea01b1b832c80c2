"""Cache-DiT through the real ComfyUI (in-process): plans on handles, branches, statistics people see."""

import copy

import torch

from .sampler_prompts import cache_node, t2v_prompt


def names(tiny):
    n = tiny["names"]
    return n[("t2v", "high", "fp32")], n[("t2v", "low", "fp32")], n[("t2v", "diffusers")]


def run_ok(comfyui, prompt, executor=None):
    result = comfyui.run(prompt, executor=executor)
    assert result.valid, result.node_errors
    assert result.success, result.execution_error()
    return result


def latent_of(comfyui, node, executor=None):
    return comfyui.cached_output(node, executor)[0][0]["samples"].clone()


def test_a_cached_run_reports_what_the_cache_did_on_each_expert(comfyui, tiny_models):
    result = run_ok(comfyui, t2v_prompt(*names(tiny_models), steps=20, decode=False, cache={}))
    report = result.outputs["5"]["report"][0]
    assert report["cache"]["plan"].startswith("high DBCache_F1B0_W4I1M0MC3_R0.24")
    for role, steps in (("high", 13), ("low", 7)):
        stats = report["cache"][role]
        assert stats["context_steps"] == [steps] and stats["config"].endswith(f"_N{steps}_CFG1")
        assert stats["cached_steps"] and stats["block_forwards"] < stats["block_forwards_without_cache"]
    assert "cache high:" in result.outputs["5"]["text"][0] and "% saved" in result.outputs["5"]["text"][0]
    assert result.outputs["20"]["text"][0].startswith("high DBCache_F1B0_W4")


def test_one_graph_two_samplers_one_loader_each_output_equals_its_branch_alone(comfyui, tiny_models):
    high, low, folder = names(tiny_models)
    cached_alone = t2v_prompt(high, low, folder, steps=12, seed=21, decode=False, cache={})
    plain_alone = t2v_prompt(high, low, folder, steps=12, seed=21, decode=False)
    ex = comfyui.new_executor()
    run_ok(comfyui, cached_alone, ex)
    expected_cached = latent_of(comfyui, "5", ex)
    ex = comfyui.new_executor()
    run_ok(comfyui, plain_alone, ex)
    expected_plain = latent_of(comfyui, "5", ex)
    assert not torch.equal(expected_cached, expected_plain)

    # A second sampler on the loader's own (uncached) handle, placed before and after the cached one.
    for first, second in ((cached_alone, plain_alone), (plain_alone, cached_alone)):
        both = copy.deepcopy(first)
        both["20"] = cache_node("1")
        both["30"] = copy.deepcopy(second["5"])
        both["31"] = {"class_type": "PreviewAny", "inputs": {"source": ["30", 1]}}
        ex = comfyui.new_executor()
        run_ok(comfyui, both, ex)
        outputs = {node: latent_of(comfyui, node, ex) for node in ("5", "30")}
        cached_node = "5" if first is cached_alone else "30"
        plain_node = "30" if cached_node == "5" else "5"
        assert torch.equal(outputs[cached_node], expected_cached)
        assert torch.equal(outputs[plain_node], expected_plain)


def test_the_cache_node_switched_off_runs_without_any_hook(comfyui, tiny_models):
    high, low, folder = names(tiny_models)
    ex = comfyui.new_executor()
    run_ok(comfyui, t2v_prompt(high, low, folder, steps=8, seed=2, decode=False), ex)
    never = latent_of(comfyui, "5", ex)
    run_ok(comfyui, t2v_prompt(high, low, folder, steps=8, seed=2, decode=False, cache={}))
    result = run_ok(comfyui, t2v_prompt(high, low, folder, steps=8, seed=2, decode=False, cache={"enabled": False}))
    assert result.outputs["20"]["text"] == ["Cache-DiT off"]
    assert result.outputs["5"]["report"][0]["cache"]["plan"] is None
    assert torch.equal(latent_of(comfyui, "5"), never)
    experts = comfyui.cached_output("1")[0][0]
    cache = comfyui.pack("nodes.core.cache")
    assert cache.leftovers(experts.high_noise) == [] and cache.leftovers(experts.low_noise) == []


def test_the_cache_node_returns_a_new_handle_and_leaves_the_loaders_alone(comfyui, tiny_models):
    prompt = t2v_prompt(*names(tiny_models), steps=4, decode=False, cache={"residual_diff_threshold": 0.1})
    run_ok(comfyui, prompt)
    loaded, cached = comfyui.cached_output("1")[0][0], comfyui.cached_output("20")[0][0]
    assert loaded.cache_plan is None and cached.cache_plan.residual_diff_threshold == 0.1
    assert cached.high_noise is loaded.high_noise


def test_a_plan_the_experts_cannot_take_is_an_error_naming_the_input(comfyui, tiny_models):
    prompt = t2v_prompt(*names(tiny_models), steps=4, decode=False, cache={"first_compute_blocks": 4})
    result = comfyui.run(prompt, executor=comfyui.new_executor())
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert "first_compute_blocks:" in message and "these experts have 4 layers" in message
