"""The two-stage sampler inside a real ComfyUI (in-process), with native nodes around it."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from .sampler_prompts import TINY_VAE, t2v_prompt


def t2v_names(tiny, fmt="fp32"):
    n = tiny["names"]
    return n[("t2v", "high", fmt)], n[("t2v", "low", fmt)], n[("t2v", "diffusers")]


def run_ok(comfyui, prompt, executor=None):
    result = comfyui.run(prompt, executor=executor)
    assert result.valid, result.node_errors
    assert result.success, result.execution_error()
    return result


def sampler_latent(comfyui, executor=None, node="5"):
    return comfyui.cached_output(node, executor)[0][0]["samples"]


def test_native_nodes_around_the_sampler_decode_and_save_a_video(comfyui, tiny_models):
    result = run_ok(comfyui, t2v_prompt(*t2v_names(tiny_models), steps=8, flow_shift=12.0))
    report = json.loads(result.outputs["6"]["text"][0])
    assert report["split"] == {"high": 6, "low": 2} and report["boundary_source"] == "model_default"
    assert report["forward_passes"] == {"high": 12, "low": 4}
    assert report["expert_per_step"] == ["high"] * 6 + ["low"] * 2
    assert result.outputs["5"]["report"][0] == report  # shown on the node as well
    output_dir = comfyui.folder_paths.get_output_directory()
    webp = result.outputs["9"]["images"][0]["filename"]
    with Image.open(os.path.join(output_dir, webp)) as video:
        assert video.n_frames == 5 and video.size == (64, 64)
        frame = np.asarray(video.convert("RGB"), dtype=np.float32)
        assert frame.std() > 1.0  # a real decode, not a blank or NaN frame
    timeline = result.outputs["10"]["images"][0]["filename"]
    with Image.open(os.path.join(output_dir, timeline)) as picture:
        assert picture.size == (768, 300)


def test_latent_is_a_copy_in_vae_space_with_comfyui_noise_for_the_seed(comfyui, tiny_models):
    import comfy.latent_formats
    import comfy.sample

    core = comfyui.pack("nodes.core.latents")
    latent = {"samples": torch.zeros(2, 16, 3, 8, 8), "batch_index": [3, 1]}
    assert torch.equal(core.initial_noise(latent["samples"].shape, 1234, latent["batch_index"]),
                       comfy.sample.prepare_noise(latent["samples"], 1234, latent["batch_index"]))
    assert torch.equal(core.initial_noise((1, 16, 2, 4, 4), 7), comfy.sample.prepare_noise(torch.zeros(1, 16, 2, 4, 4), 7))
    x = torch.randn(1, 16, 2, 4, 4)
    fmt = comfy.latent_formats.Wan21()
    assert torch.allclose(core.to_model_space(x), fmt.process_in(x), atol=1e-6)
    assert torch.allclose(core.to_vae_space(x), fmt.process_out(x), atol=1e-6)


def test_the_node_runs_the_core_loop_on_comfyui_noise_and_text(comfyui, tiny_models):
    """The node's latent equals the core loop fed by hand with the same noise and embeddings."""
    high, low, folder = t2v_names(tiny_models)
    executor = comfyui.new_executor()
    run_ok(comfyui, t2v_prompt(high, low, folder, steps=6, seed=99, decode=False), executor)
    got = sampler_latent(comfyui, executor)
    experts = comfyui.cached_output("1", executor)[0][0]
    schedule = comfyui.cached_output("2", executor)[0][0]
    encoded = comfyui.cached_output("3", executor)
    positive, negative = encoded[0][0], encoded[1][0]
    core = comfyui.pack("nodes.core.denoise")
    inputs = core.DenoiseInputs(positive=positive[0][0], negative=negative[0][0],
                                noise=comfyui.pack("nodes.core.latents").initial_noise((1, 16, 2, 8, 8), 99))
    expected, _ = core.denoise(experts, schedule, inputs, 4.0, 3.0)
    assert torch.equal(got, comfyui.pack("nodes.core.latents").to_vae_space(expected))


def test_seeds_a_b_a_give_bit_identical_a_results(comfyui, tiny_models):
    high, low, folder = t2v_names(tiny_models)
    results = []
    for seed in (5, 6, 5):
        run_ok(comfyui, t2v_prompt(high, low, folder, steps=6, seed=seed, decode=False))
        results.append(sampler_latent(comfyui).clone())
    assert torch.equal(results[0], results[2]) and not torch.equal(results[0], results[1])


def test_at_most_one_expert_is_on_the_compute_device_at_any_time(comfyui, tiny_models):
    result = run_ok(comfyui, t2v_prompt(*t2v_names(tiny_models), steps=10, decode=False))
    moves = result.outputs["5"]["report"][0]["device_moves"]
    resident, most = set(), 0
    for role, where in moves:
        (resident.add if where == "compute" else resident.discard)(role)
        most = max(most, len(resident))
    assert most == 1 and resident == set()
    assert [m[0] for m in moves if m[1] == "compute"] == ["high", "low"]


@pytest.mark.parametrize("which,expected", [("low", "low"), ("high", "high")])
def test_one_expert_alone_runs_every_step(comfyui, tiny_models, which, expected):
    high, low, folder = t2v_names(tiny_models)
    prompt = t2v_prompt(high if which == "high" else "none", low if which == "low" else "none", folder,
                        sampler="euler", steps=5, decode=False)
    report = run_ok(comfyui, prompt).outputs["5"]["report"][0]
    assert report["expert_per_step"] == [expected] * 5
    assert report["device_moves"] == [[expected, "compute"], [expected, "offload"]]


def test_cfg_one_runs_a_single_forward_per_step(comfyui, tiny_models):
    report = run_ok(comfyui, t2v_prompt(*t2v_names(tiny_models), steps=8, cfg_low=1.0, decode=False)).outputs["5"]
    assert report["report"][0]["forward_passes"] == {"high": 12, "low": 2}


def i2v_prompt(tiny, with_image=True, experts_task="i2v"):
    n = tiny["names"]
    prompt = t2v_prompt(n[(experts_task, "high", "fp16")], n[(experts_task, "low", "fp16")], n[("t2v", "diffusers")],
                        steps=6, flow_shift=5.0, decode=False)
    prompt["12"] = {"class_type": "LoadImage", "inputs": {"image": "wan22_start.png"}}
    prompt["13"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    prompt["14"] = {"class_type": "WanImageToVideo",
                    "inputs": {"positive": ["3", 0], "negative": ["3", 1], "vae": ["13", 0], "width": 64,
                               "height": 64, "length": 5, "batch_size": 1}}
    if with_image:
        prompt["14"]["inputs"]["start_image"] = ["12", 0]
    prompt["5"]["inputs"].update(positive=["14", 0], negative=["14", 1], latent_image=["14", 2])
    return prompt


@pytest.fixture
def start_image(comfyui):
    path = os.path.join(comfyui.folder_paths.get_input_directory(), "wan22_start.png")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


def test_image_to_video_through_native_wan_image_to_video(comfyui, tiny_models, start_image):
    result = run_ok(comfyui, i2v_prompt(tiny_models))
    report = result.outputs["5"]["report"][0]
    expected = comfyui.pack("nodes.core.schedule").build_schedule(
        sampler="unipc", steps=6, flow_shift=5.0, has_high=True, has_low=True, model_default=0.9).split
    assert report["boundary_ratio"] == 0.9 and (report["split"]["high"], report["split"]["low"]) == expected
    assert report["forward_passes"] == {"high": 2 * expected[0], "low": 2 * expected[1]}


def execution_error(comfyui, prompt):
    result = comfyui.run(prompt, executor=comfyui.new_executor())
    assert result.valid, result.node_errors
    assert not result.success
    return result.execution_error()["exception_message"]


def test_t2v_experts_given_i2v_conditioning_are_refused(comfyui, tiny_models, start_image):
    message = execution_error(comfyui, i2v_prompt(tiny_models, experts_task="t2v"))
    assert "positive: carries an image-to-video start image" in message and "load the Wan2.2 I2V experts" in message


def test_i2v_experts_without_a_start_image_are_refused(comfyui, tiny_models, start_image):
    message = execution_error(comfyui, i2v_prompt(tiny_models, with_image=False))
    assert "positive: the image-to-video experts need a start image" in message


def test_combined_conditioning_is_refused_with_what_to_change(comfyui, tiny_models):
    prompt = t2v_prompt(*t2v_names(tiny_models), steps=4, decode=False)
    prompt["15"] = {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["3", 0],
                                                                   "conditioning_2": ["3", 1]}}
    prompt["5"]["inputs"]["positive"] = ["15", 0]
    message = execution_error(comfyui, prompt)
    assert "positive: has 2 entries" in message and "encode one prompt" in message


def test_a_latent_the_experts_cannot_take_is_refused(comfyui, tiny_models):
    prompt = t2v_prompt(*t2v_names(tiny_models), steps=4, decode=False)
    prompt["4"] = {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    message = execution_error(comfyui, prompt)
    assert "latent_image: has shape [1, 16, 8, 8]" in message and "EmptyHunyuanLatentVideo" in message


def test_a_latent_batch_gets_one_noise_per_item_and_the_text_is_shared(comfyui, tiny_models):
    high, low, folder = t2v_names(tiny_models)
    run_ok(comfyui, t2v_prompt(high, low, folder, steps=4, seed=3, batch=2, decode=False))
    batch = sampler_latent(comfyui).clone()
    assert batch.shape[0] == 2 and not torch.equal(batch[0], batch[1])


def test_a_failed_run_leaves_nothing_behind(comfyui, tiny_models):
    high, low, folder = t2v_names(tiny_models)
    good = t2v_prompt(high, low, folder, steps=6, seed=11, decode=False)
    executor = comfyui.new_executor()
    run_ok(comfyui, good, executor)
    first = sampler_latent(comfyui, executor).clone()
    bad = t2v_prompt(high, low, folder, steps=6, seed=11, decode=False)
    bad["4"] = {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    execution_error(comfyui, bad)
    executor = comfyui.new_executor()
    run_ok(comfyui, good, executor)
    assert torch.equal(sampler_latent(comfyui, executor), first)


@pytest.mark.parametrize("mask_frames,size", [(1, (8, 8)), (2, (8, 8)), (1, (4, 4))])
def test_the_i2v_input_is_built_as_comfyui_builds_it(comfyui, mask_frames, size):
    """Our 20 extra channels equal ComfyUI's own WAN21.concat_cond on WanImageToVideo-style inputs."""
    from types import SimpleNamespace

    import comfy.latent_formats
    import comfy.model_base

    fmt = comfy.latent_formats.Wan21()
    model = SimpleNamespace(diffusion_model=SimpleNamespace(patch_embedding=SimpleNamespace(
        weight=torch.empty(8, 36, 1, 2, 2))), latent_format=fmt, process_latent_in=fmt.process_in,
        image_to_video=True)
    noise = torch.randn(2, 16, 3, 8, 8)
    image = torch.randn(1, 16, 3, *size)
    mask = torch.ones(1, 1, 3, *size)
    mask[:, :, :mask_frames] = 0.0
    theirs = comfy.model_base.WAN21.concat_cond(model, noise=noise, concat_latent_image=image, concat_mask=mask,
                                                device="cpu")
    ours = comfyui.pack("nodes.core.latents").image_to_video_condition(image, mask, noise.shape)
    assert ours.shape == theirs.shape == (2, 20, 3, 8, 8)
    assert torch.allclose(ours, theirs, atol=1e-6)
