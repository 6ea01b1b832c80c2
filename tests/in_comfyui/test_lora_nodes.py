"""Wan2.2 LoRA (per expert) through the real ComfyUI (in-process): handles stay values, branches keep
their own LoRAs, LoRA + cache repeat, bad files are refused by name."""

import copy

import torch

from .sampler_prompts import lora_node, t2v_prompt
from .test_cache_nodes import latent_of, names, run_ok


def template_prompt(tiny, seed=5, **kw):
    """The official LightX2V set-up: 4 euler steps, shift 5, CFG 1, boundary auto."""
    lora = kw.pop("lora", {"high": tiny["loras"]["high"], "low": tiny["loras"]["low"]})
    return t2v_prompt(*names(tiny), sampler="euler", steps=4, flow_shift=5.0, cfg_high=1.0, cfg_low=1.0, seed=seed,
                      decode=False, lora=lora, **kw)


def test_the_template_set_up_splits_two_and_two_and_reports_its_loras(comfyui, tiny_models):
    result = run_ok(comfyui, template_prompt(tiny_models))
    report = result.outputs["5"]["report"][0]
    assert report["split"] == {"high": 2, "low": 2} and report["boundary_ratio"] == 0.875
    assert report["forward_passes"] == {"high": 2, "low": 2}  # CFG 1: one forward per step
    assert [u["file"] for u in report["loras"]["high"]] == [tiny_models["loras"]["high"]]
    assert [u["file"] for u in report["loras"]["low"]] == [tiny_models["loras"]["low"]]
    assert "LoRA high: wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors x1" in result.outputs["5"]["text"][0]
    assert "rank 4" in result.outputs["40"]["text"][0]


def test_one_graph_lora_on_one_branch_only_each_output_equals_its_branch_alone(comfyui, tiny_models):
    with_lora = template_prompt(tiny_models, seed=9)
    plain = template_prompt(tiny_models, seed=9, lora=None)
    expected = {}
    for key, prompt in (("lora", with_lora), ("plain", plain)):
        ex = comfyui.new_executor()
        run_ok(comfyui, prompt, ex)
        expected[key] = latent_of(comfyui, "5", ex)
    assert not torch.equal(expected["lora"], expected["plain"])

    lora = comfyui.pack("nodes.core.lora")
    for first, second in ((with_lora, plain), (plain, with_lora)):
        both = copy.deepcopy(first)
        both["40"] = copy.deepcopy(with_lora["40"])
        both["30"] = copy.deepcopy(second["5"])
        both["31"] = {"class_type": "PreviewAny", "inputs": {"source": ["30", 1]}}
        ex = comfyui.new_executor()
        run_ok(comfyui, both, ex)
        lora_node_id = "5" if first is with_lora else "30"
        plain_node_id = "30" if lora_node_id == "5" else "5"
        assert torch.equal(latent_of(comfyui, lora_node_id, ex), expected["lora"])
        assert torch.equal(latent_of(comfyui, plain_node_id, ex), expected["plain"])
        # Afterwards the experts carry only what a handle of this graph asked for, and the loader's own
        # handle is untouched (no LoRA on it).
        loaded, with_loras = comfyui.cached_output("1", ex)[0][0], comfyui.cached_output("40", ex)[0][0]
        assert loaded.loras == () and len(with_loras.loras) == 2
        for module, role in ((loaded.high_noise, "high"), (loaded.low_noise, "low")):
            asked = [[], [f"{lora.ADAPTER_PREFIX}0"]]
            assert lora.adapter_names(module) in asked
    # The next run of the plain branch on the same experts (a new seed, so the sampler is not served from
    # ComfyUI's cache) takes every adapter off again.
    experts = comfyui.cached_output("1", ex)[0][0]
    assert lora.adapter_names(experts.high_noise) == [f"{lora.ADAPTER_PREFIX}0"]  # the LoRA branch ran last
    run_ok(comfyui, template_prompt(tiny_models, seed=10, lora=None), ex)
    assert lora.leftovers(experts.high_noise) == [] and lora.leftovers(experts.low_noise) == []


def test_lora_and_cache_seeds_a_b_a_are_bit_identical(comfyui, tiny_models):
    ex = comfyui.new_executor()
    latents = []
    for seed in (3, 4, 3):
        prompt = t2v_prompt(*names(tiny_models), steps=12, flow_shift=5.0, seed=seed, decode=False,
                            lora={"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]},
                            cache={"high_warmup_steps": 1, "low_warmup_steps": 1})
        result = run_ok(comfyui, prompt, ex)
        latents.append(latent_of(comfyui, "5", ex))
        report = result.outputs["5"]["report"][0]
        assert report["loras"]["high"] and report["cache"]["low"]["config"]
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])


def test_at_four_steps_the_report_says_the_cache_can_skip_nothing(comfyui, tiny_models):
    result = run_ok(comfyui, template_prompt(tiny_models, cache={}))
    report = result.outputs["5"]["report"][0]
    for role in ("high", "low"):
        assert report["cache"][role]["skippable_steps"] == 0 and report["cache"][role]["cached_steps"] == []
    text = result.outputs["5"]["text"][0]
    assert "the cache can skip none of the high-noise expert's 2 steps" in text
    assert "the cache can skip none of the low-noise expert's 2 steps" in text


def test_strength_zero_through_the_nodes_is_bit_identical_to_no_lora_node(comfyui, tiny_models):
    ex = comfyui.new_executor()
    run_ok(comfyui, template_prompt(tiny_models, seed=2, lora=None), ex)
    plain = latent_of(comfyui, "5", ex)
    loras = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"], "high_strength": 0.0,
             "low_strength": 0.0}
    run_ok(comfyui, template_prompt(tiny_models, seed=2, lora=loras), ex)
    assert torch.equal(latent_of(comfyui, "5", ex), plain)


def test_a_lightx2v_format_lora_runs_through_the_nodes(comfyui, tiny_models):
    loras = {"high": tiny_models["loras"]["lightx2v"], "low": tiny_models["loras"]["lightx2v"],
             "low_strength": 0.5}
    result = run_ok(comfyui, template_prompt(tiny_models, lora=loras))
    assert "LoRA low: wan22_lightx2v_format_lora.safetensors x0.5" in result.outputs["5"]["text"][0]


def test_bad_loras_are_refused_naming_the_input_and_file(comfyui, tiny_models):
    truncated = template_prompt(tiny_models, lora={"high": tiny_models["loras"]["truncated"]})
    result = comfyui.run(truncated, executor=comfyui.new_executor())
    assert not result.valid
    assert any("high_noise_lora:" in e and "truncated" in e for e in result.node_error_details("40"))

    wide = template_prompt(tiny_models, lora={"low": tiny_models["loras"]["wide"]})
    shared = comfyui.new_executor()
    result = comfyui.run(wide, executor=shared)
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert message.startswith("low_noise_lora: wan2.2_5B_style_lora.safetensors does not fit these experts")

    high, low, folder = names(tiny_models)
    low_only = t2v_prompt("none", low, folder, sampler="euler", steps=4, decode=False,
                          lora={"high": tiny_models["loras"]["high"]})
    result = comfyui.run(low_only, executor=comfyui.new_executor())
    message = result.execution_error()["exception_message"]
    assert "high_noise_lora:" in message and "high-noise expert, which is not loaded" in message
    # The bad prompt left nothing behind: the next good run on the same experts equals a fresh one.
    run_ok(comfyui, template_prompt(tiny_models, seed=1), shared)
    first = latent_of(comfyui, "5", shared)
    fresh = comfyui.new_executor()
    run_ok(comfyui, template_prompt(tiny_models, seed=1), fresh)
    assert torch.equal(latent_of(comfyui, "5", fresh), first)
