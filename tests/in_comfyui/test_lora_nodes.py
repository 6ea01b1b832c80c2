"""LoRAs on native experts through the real ComfyUI (in-process): our LoRA node is ComfyUI's own LoRA loading,
native LoRA loaders work upstream of the MODEL bridge, branches keep their own LoRAs, bad files are refused."""

import pytest
import torch

from .prompts import (FINAL, bridged, expert_files, failed_at_run, latent_of, loader, native_prompt, our_prompt,
                      refused_at_queue, report_of, run_ok, text_folder, two_samplers_in_one_graph)

# The official template's LightX2V set-up: euler/simple, 4 steps, shift 5, CFG 1 (switch at 2).
TEMPLATE = dict(sampler="euler", scheduler="simple", steps=4, flow_shift=5.0, cfg=(1.0, 1.0))


def native_with(comfyui, tiny, loras, seed, **run):
    run = {**TEMPLATE, **run}
    run_ok(comfyui, native_prompt(*expert_files(tiny), text_folder(tiny), switch=2, loras=loras, seed=seed, **run))
    return latent_of(comfyui, FINAL["native"])


@pytest.mark.parametrize("fmt", ["comfy", "lightx2v", "musubi"])
def test_our_lora_node_equals_comfyuis_lora_loader_model_only_bit_for_bit(comfyui, tiny_models, fmt):
    loras = tiny_models["loras"]
    high, low = (loras["high"], loras["low"]) if fmt == "comfy" else (loras[fmt], loras[fmt])
    result = run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=5,
                                        **TEMPLATE,
                                        lora={"high": high, "low": low, "low_strength": 0.7}))
    ours = latent_of(comfyui, FINAL["ours"])
    assert torch.equal(ours, native_with(comfyui, tiny_models, {"high": (high, 1.0), "low": (low, 0.7)}, 5))
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=5, **TEMPLATE))
    assert not torch.equal(ours, latent_of(comfyui, FINAL["ours"]))  # the LoRAs really changed the run
    # Every block linear (10 per block, 4 blocks); LightX2V's files also patch those 40 biases, each block's
    # norm3 weight and bias (8) and the head's weight and bias (2).
    patched = report_of(result)["loras"]["low"][0]["patched_weights"]
    assert patched == (40 + 40 + 8 + 2 if fmt == "lightx2v" else 40)


def test_native_lora_loaders_upstream_of_the_bridge_equal_the_native_template(comfyui, tiny_models):
    loras = {"high": (tiny_models["loras"]["high"], 1.0), "low": (tiny_models["loras"]["low"], 1.0)}
    run_ok(comfyui, our_prompt(bridged(*expert_files(tiny_models), loras=loras), text_folder(tiny_models), seed=6,
                               **TEMPLATE))
    assert torch.equal(latent_of(comfyui, FINAL["ours"]), native_with(comfyui, tiny_models, loras, 6))


def test_chained_lora_nodes_equal_chained_native_lora_loaders(comfyui, tiny_models):
    loras = tiny_models["loras"]
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=7, **TEMPLATE,
                        lora={"high": loras["high"], "high_strength": 0.5})
    prompt["41"] = {"class_type": "Wan22LoraLoader",
                    "inputs": {"experts": ["40", 0], "high_noise_lora": loras["musubi"], "high_noise_strength": 0.8,
                               "low_noise_lora": "none", "low_noise_strength": 1.0}}
    prompt["5"]["inputs"]["experts"] = ["41", 0]
    report = report_of(run_ok(comfyui, prompt))
    assert [u["file"] for u in report["loras"]["high"]] == [loras["high"], loras["musubi"]]
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(*expert_files(tiny_models), text_folder(tiny_models), switch=2, seed=7, **TEMPLATE,
                           loras={"high": (loras["high"], 0.5)})
    native["112"] = {"class_type": "LoraLoaderModelOnly",
                     "inputs": {"model": ["12", 0], "lora_name": loras["musubi"], "strength_model": 0.8}}
    native["14"]["inputs"]["model"] = ["112", 0]
    run_ok(comfyui, native)
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_strength_zero_is_bit_identical_to_no_lora_node(comfyui, tiny_models):
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=2, **TEMPLATE))
    plain = latent_of(comfyui, FINAL["ours"])
    loras = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"], "high_strength": 0.0,
             "low_strength": 0.0}
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=2, **TEMPLATE,
                               lora=loras))
    assert torch.equal(latent_of(comfyui, FINAL["ours"]), plain)


def test_one_graph_lora_on_one_branch_only_each_output_equals_its_branch_alone(comfyui, tiny_models):
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]}
    with_lora = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=9, **TEMPLATE, lora=lora)
    plain = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=9, **TEMPLATE)
    expected = {}
    for key, prompt in (("lora", with_lora), ("plain", plain)):
        executor = comfyui.new_executor()
        run_ok(comfyui, prompt, executor)
        expected[key] = latent_of(comfyui, FINAL["ours"], executor)
    for first, second in (("lora", "plain"), ("plain", "lora")):
        executor = comfyui.new_executor()
        prompts = {"lora": with_lora, "plain": plain}
        latents = two_samplers_in_one_graph(comfyui, prompts[first], prompts[second], executor)
        assert torch.equal(latents[0], expected[first]) and torch.equal(latents[1], expected[second])
        loaded, with_loras = comfyui.cached_output("1", executor)[0][0], comfyui.cached_output("40", executor)[0][0]
        assert loaded.loras == () and len(with_loras.loras) == 2
        assert loaded.high.patches == {} and with_loras.high.patches  # the LoRA lives on its own clone


def test_the_lora_node_reports_what_it_added(comfyui, tiny_models):
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["lightx2v"], "low_strength": 0.5}
    result = run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), **TEMPLATE,
                                        lora=lora))
    node_text = result.outputs["40"]["text"][0]
    assert f"high-noise: {lora['high']} x1 (40 weights patched)" in node_text
    assert f"low-noise: {lora['low']} x0.5 (" in node_text
    assert f"LoRA low: {lora['low']} x0.5" in result.outputs["5"]["text"][0]


def test_a_truncated_lora_is_refused_at_queue_time(comfyui, tiny_models):
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), **TEMPLATE,
                        lora={"high": tiny_models["loras"]["truncated"]})
    details = refused_at_queue(comfyui, prompt, node="40")
    assert "high_noise_lora:" in details and "truncated" in details and "download the LoRA again" in details


@pytest.mark.parametrize("which,fragment", [
    ("wide", "does not fit these experts"),
    ("model_file", "is not a LoRA for these experts"),
    ("diffusers", "is not a LoRA for these experts"),  # diffusers' own names: ComfyUI reads no Wan LoRA in them
])
def test_a_lora_comfyui_cannot_apply_to_these_experts_is_refused_by_name(comfyui, tiny_models, which, fragment):
    name = tiny_models["loras"][which]
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), **TEMPLATE, lora={"low": name})
    assert failed_at_run(comfyui, prompt).startswith(f"low_noise_lora: {name} {fragment}")


def test_a_lora_for_an_expert_that_is_not_loaded_is_refused(comfyui, tiny_models):
    low_only = our_prompt(loader(low=expert_files(tiny_models)[1]), text_folder(tiny_models), **TEMPLATE,
                          lora={"high": tiny_models["loras"]["high"]})
    message = failed_at_run(comfyui, low_only)
    assert message.startswith("high_noise_lora:") and "high-noise expert, which is not loaded" in message


def test_a_run_with_loras_that_fails_midway_leaves_the_experts_without_them(comfyui, tiny_models, progress_hook):
    """The LoRA run fails at its low-noise stage's first step, its LoRAs patched into the shared weights: the
    same loaded experts without the LoRA node then give what they give on a fresh executor."""
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]}
    experts = loader(*expert_files(tiny_models))
    executor = comfyui.new_executor()
    progress_hook.append(progress_hook.failing_at("5", call=3))  # 2 high / 2 low
    failed = comfyui.run(our_prompt(experts, text_folder(tiny_models), seed=1, **TEMPLATE, lora=lora), executor)
    assert failed.valid and not failed.success
    progress_hook.clear()
    plain = our_prompt(experts, text_folder(tiny_models), seed=1, **TEMPLATE)
    run_ok(comfyui, plain, executor)  # the loader's experts, as the failed run left them
    fresh = comfyui.new_executor()
    run_ok(comfyui, plain, fresh)
    assert torch.equal(latent_of(comfyui, FINAL["ours"], executor), latent_of(comfyui, FINAL["ours"], fresh))
