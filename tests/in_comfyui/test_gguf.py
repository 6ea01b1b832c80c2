"""GGUF experts, as most Wan2.2 A14B users run them: ComfyUI-GGUF's own UnetLoaderGGUF (an unmodified copy,
linked in where it is there) on tiny experts that the `gguf` package wrote and quantized, with LoRAs and
the cache, against ComfyUI's own graph on the same files."""

import pytest
import torch

from .cache_state import leftovers
from .prompts import (CACHING, FINAL, bridged, diffusion_models, gguf_loaders, latent_of, native_prompt, our_prompt,
                      report_of, run_ok, text_folder)

RUN = dict(sampler="euler", steps=10, flow_shift=5.0, width=32, height=32, length=1)


def files(gguf_experts, qtype, task="t2v"):
    return gguf_experts[(task, "high", qtype)], gguf_experts[(task, "low", qtype)]


def loras_of(tiny):
    return {"high": (tiny["loras"]["high"], 1.0), "low": (tiny["loras"]["low"], 1.0)}


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_1", "F16"])
def test_gguf_experts_with_a_lora_each_equal_comfyuis_own_gguf_graph_with_the_cache_off(gguf_comfyui, tiny_models,
                                                                                       gguf_experts, qtype):
    comfyui, (high, low), loras = gguf_comfyui, files(gguf_experts, qtype), loras_of(tiny_models)
    result = run_ok(comfyui, gguf_loaders(our_prompt(bridged(high, low, loras=loras), text_folder(tiny_models),
                                                     seed=3, **RUN)))
    ours = latent_of(comfyui, FINAL["ours"])
    assert type(comfyui.cached_output("10")[0][0]).__name__ == "GGUFModelPatcher"
    run_ok(comfyui, gguf_loaders(native_prompt(high, low, text_folder(tiny_models), loras=loras,
                                               switch=report_of(result)["split"]["high"], seed=3, **RUN)))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_1"])
def test_our_lora_node_on_gguf_experts_equals_comfyuis_lora_loader(gguf_comfyui, tiny_models, gguf_experts, qtype):
    comfyui, (high, low), loras = gguf_comfyui, files(gguf_experts, qtype), tiny_models["loras"]
    result = run_ok(comfyui, gguf_loaders(our_prompt(bridged(high, low), text_folder(tiny_models), seed=5,
                                                     lora={"high": loras["high"], "low": loras["low"]}, **RUN)))
    assert "weights patched" in result.outputs["40"]["text"][0]
    ours = latent_of(comfyui, FINAL["ours"])
    run_ok(comfyui, gguf_loaders(native_prompt(high, low, text_folder(tiny_models), loras=loras_of(tiny_models),
                                               switch=report_of(result)["split"]["high"], seed=5, **RUN)))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_1"])
def test_the_cache_on_gguf_experts_with_loras_caches_repeats_a_b_a_and_leaves_nothing(gguf_comfyui, tiny_models,
                                                                                     gguf_experts, qtype):
    comfyui, (high, low) = gguf_comfyui, files(gguf_experts, qtype)
    executor = comfyui.new_executor()
    latents, reports = [], []
    for seed in (3, 4, 3):
        result = run_ok(comfyui, gguf_loaders(our_prompt(bridged(high, low, loras=loras_of(tiny_models)),
                                                         text_folder(tiny_models), cache=CACHING, seed=seed, **RUN)),
                        executor)
        latents.append(latent_of(comfyui, FINAL["ours"], executor))
        reports.append(report_of(result))
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    for role in ("high", "low"):
        stats = reports[0]["cache"][role]
        assert stats["cached_steps"] and stats["block_forwards"] < stats["block_forwards_without_cache"], role
        assert reports[2]["cache"][role]["cached_steps"] == stats["cached_steps"]
    for role, model in diffusion_models(comfyui, executor=executor).items():
        assert leftovers(model) == [] and len(model.blocks) == 4, role
    for node in ("10", "11", "12", "13"):  # the GGUF MODELs we received carry none of our wrappers
        options = comfyui.cached_output(node, executor)[0][0].model_options.get("transformer_options", {})
        assert "wrappers" not in options, node


def test_the_live_split_reads_the_task_off_gguf_experts_behind_the_bridge(gguf_server, gguf_experts, tiny_models):
    from .test_server import split_request

    i2v = bridged(*files(gguf_experts, "Q8_0", "i2v"))
    answer = split_request(gguf_server, gguf_loaders(i2v), flow_shift=5.0)
    assert (answer["boundary_ratio"], answer["boundary_known"]) == (0.9, True)
    t2v = gguf_loaders(bridged(*files(gguf_experts, "Q5_1"), loras=loras_of_names(tiny_models)))
    answer = split_request(gguf_server, t2v, flow_shift=12.0)
    assert (answer["high"], answer["boundary_ratio"], answer["boundary_known"]) == (26, 0.875, True)


def loras_of_names(tiny_models):
    return {"high": (tiny_models["loras"]["high"], 1.0)}
