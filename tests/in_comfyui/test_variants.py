"""The other Wan2.2 variants through the bridge and the loaders, on tiny stand-ins in ComfyUI's own layout with
ComfyUI's own conditioning nodes, against the native graph on the same files: Fun-InP (image-to-video layout,
boundary 0.900), Fun-Control (52 channels, a reference image's tokens in front of the sequence), Fun-Camera (the
image-to-video layout, a camera adapter before the blocks), VACE-Fun (a control stream whose hints are added after
given blocks) and TI2V-5B (one transformer, 48 channels) run; S2V and Animate are refused by name, saying why."""

import os

import pytest
import torch
from safetensors.torch import save_file

from devtools import tiny_wan

from .cache_state import leftovers
from .prompts import (CACHING, CONDITIONING, FINAL, NEVER, TINY_VAE, TRIMMED, bridged, cache_model_node, conditioned,
                      diffusion_models, failed_at_run, latent_of, loader, native_prompt, native_three_ksamplers,
                      one_ksampler_prompt, our_prompt, report_of, run_ok, text_folder, three_stage_prompt,
                      with_model_caches)

RUN = dict(sampler="euler", steps=6, flow_shift=5.0, seed=4, cfg=(3.5, 3.5))
MODEL_CACHING = {"residual_diff_threshold": CACHING["residual_diff_threshold"], "warmup_steps": 1}  # as CACHING
@pytest.mark.parametrize("variant", sorted(set(CONDITIONING) - {"vace"}))  # VACE: its own tests below
def test_fun_experts_run_through_the_bridge_equal_to_native(comfyui, tiny_models, variant_experts, image, variant):
    high, low = variant_experts[(variant, "high")], variant_experts[(variant, "low")]
    result = run_ok(comfyui, conditioned(our_prompt(bridged(high, low), text_folder(tiny_models), **RUN), ["5"],
                                         variant, image))
    report = report_of(result)
    assert report["boundary_ratio"] == 0.9 and 0 < report["split"]["high"] < RUN["steps"]
    model = diffusion_models(comfyui)["high"]
    assert model.patch_embedding.in_channels == {"fun_inpaint": 36, "fun_control": 52, "fun_camera": 36}[variant]
    assert (model.ref_conv is not None) == (variant == "fun_control")
    assert (type(model).__name__ == "CameraWanModel") == (variant == "fun_camera")
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **RUN)
    run_ok(comfyui, conditioned(native, ["16", "17"], variant, image))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))
    report = report_of(run_ok(comfyui, conditioned(our_prompt(bridged(high, low), text_folder(tiny_models),
                                                              cache=CACHING, **RUN), ["5"], variant, image)))
    assert report["cache"]["high"]["cached_steps"] or report["cache"]["low"]["cached_steps"]


def test_fun_camera_experts_cache_on_the_pack_loader_and_on_comfyuis_graph_repeat_and_leave_nothing(
        comfyui, tiny_models, variant_experts, image):
    """Fun-Camera A14B (ComfyUI's CameraWanModel: its camera adapter added to the patch embedding, then WanModel's
    block loop) through Load Wan2.2 Experts and the sampler's Cache-DiT, and through ComfyUI's own two
    KSamplerAdvanced with the Cache-DiT MODEL node on each expert: each caches, seeds A, B, A give A bit for bit,
    and nothing of the cache stays on either model. (Uncached through the bridge, it equals ComfyUI's graph: the
    test above.)"""
    high, low = variant_experts[("fun_camera", "high")], variant_experts[("fun_camera", "low")]
    ours, native = [], []
    for seed in (4, 5, 4):
        run = {**RUN, "seed": seed}
        report = report_of(run_ok(comfyui, conditioned(our_prompt(loader(high, low), text_folder(tiny_models),
                                                                  cache=CACHING, **run), ["5"], "fun_camera", image)))
        assert report["cache"]["high"]["cached_steps"] and report["cache"]["low"]["cached_steps"], report["cache"]
        ours.append(latent_of(comfyui, FINAL["ours"]))
        graph = with_model_caches(native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"],
                                                **run), high=MODEL_CACHING, low=MODEL_CACHING)
        run_ok(comfyui, conditioned(graph, ["16", "17"], "fun_camera", image))
        native.append(latent_of(comfyui, FINAL["native"]))
        models = {**diffusion_models(comfyui), **{f"unet {n}": comfyui.cached_output(n)[0][0].model.diffusion_model
                                                   for n in ("10", "11")}}
        assert {type(m).__name__ for m in models.values()} == {"CameraWanModel"}
        assert all(leftovers(m) == [] for m in models.values())
    for latents in (ours, native):
        assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    uncached = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **RUN)
    run_ok(comfyui, conditioned(uncached, ["16", "17"], "fun_camera", image))
    assert not torch.equal(native[0], latent_of(comfyui, FINAL["native"])), "the MODEL node cached nothing"


def test_fun_camera_experts_without_their_camera_path_are_refused(comfyui, tiny_models, variant_experts, image):
    high, low = variant_experts[("fun_camera", "high")], variant_experts[("fun_camera", "low")]
    prompt = conditioned(our_prompt(loader(high, low), text_folder(tiny_models), **RUN), ["5"], "fun_camera", image)
    del prompt["114"]["inputs"]["camera_conditions"]
    message = failed_at_run(comfyui, prompt)
    assert message.startswith("positive: the Fun-Camera experts need a start image and a camera path") and (
        "WanCameraImageToVideo" in message and "WanCameraEmbedding" in message), message


def test_fun_control_experts_without_their_control_latent_are_refused(comfyui, tiny_models, variant_experts):
    high, low = variant_experts[("fun_control", "high")], variant_experts[("fun_control", "low")]
    message = failed_at_run(comfyui, our_prompt(bridged(high, low), text_folder(tiny_models), **RUN))
    assert message.startswith("positive: the Fun-Control experts need their control latent") and (
        "Wan22FunControlToVideo" in message)


def test_vace_experts_uncached_equal_comfyuis_vace_graph_through_the_bridge_and_the_loader(
        comfyui, tiny_models, variant_experts, image):
    """VACE-Fun A14B (ComfyUI's VaceWanModel, here two VACE blocks after main blocks 0 and 2) with
    WanVaceToVideo's control video and reference image, trimmed after the sampling as ComfyUI's template does:
    the pack's sampler, with the experts from the bridge or from Load Wan2.2 Experts, equals ComfyUI's two
    KSamplerAdvanced on the same files bit for bit; so does its Cache-DiT installed where it caches no step (the
    hints then added by the pack after their blocks, not by ComfyUI's loop)."""
    high, low = variant_experts[("vace", "high")], variant_experts[("vace", "low")]
    trimmed = []
    for experts, cache in ((bridged(high, low), None), (loader(high, low), None), (loader(high, low), NEVER)):
        report = report_of(run_ok(comfyui, conditioned(our_prompt(experts, text_folder(tiny_models), cache=cache,
                                                                  **RUN), ["5"], "vace", image)))
        assert report["boundary_ratio"] == 0.875 and 0 < report["split"]["high"] < RUN["steps"]
        trimmed.append(latent_of(comfyui, TRIMMED["ours"]))
    model = diffusion_models(comfyui)["high"]
    assert type(model).__name__ == "VaceWanModel" and model.vace_layers_mapping == {0: 0, 2: 1}
    native = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **RUN)
    run_ok(comfyui, conditioned(native, ["16", "17"], "vace", image))
    assert latent_of(comfyui, FINAL["native"]).shape[2] == trimmed[0].shape[2] + 1  # the reference frame, trimmed
    for ours in trimmed:
        assert torch.equal(ours, latent_of(comfyui, TRIMMED["native"]))


def vace_models(comfyui) -> dict:
    """The VACE transformers of the last run: the pack's experts and the native graph's UNETLoaders'."""
    return {**diffusion_models(comfyui), **{f"unet {n}": comfyui.cached_output(n)[0][0].model.diffusion_model
                                            for n in ("10", "11")}}


def test_vace_experts_cache_on_the_pack_loader_and_on_comfyuis_graph_repeat_and_leave_nothing(
        comfyui, tiny_models, variant_experts, image):
    """VACE-Fun A14B cached by the sampler's Cache-DiT and by the Cache-DiT MODEL node on ComfyUI's own graph:
    each caches, its hints fresh (every VACE block runs on every transformer call), seeds A, B, A give A bit for
    bit, and nothing of the cache stays on the models (no hook, ComfyUI's own mapping of the hints back)."""
    high, low = variant_experts[("vace", "high")], variant_experts[("vace", "low")]
    ours, native = [], []
    for seed in (4, 5, 4):
        run = {**RUN, "seed": seed}
        report = report_of(run_ok(comfyui, conditioned(our_prompt(loader(high, low), text_folder(tiny_models),
                                                                  cache=CACHING, **run), ["5"], "vace", image)))
        for role in ("high", "low"):
            stats = report["cache"][role]
            assert stats["cached_steps"] and stats["vace_hints"] == "fresh", stats
            calls = stats["block_forwards_without_cache"] // 4  # the transformer calls (4 blocks each)
            assert stats["vace_block_forwards"] == tiny_wan.VACE_BLOCKS * calls, stats
        ours.append(latent_of(comfyui, TRIMMED["ours"]))
        graph = with_model_caches(native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"],
                                                **run), high=MODEL_CACHING, low=MODEL_CACHING)
        run_ok(comfyui, conditioned(graph, ["16", "17"], "vace", image))
        native.append(latent_of(comfyui, TRIMMED["native"]))
        for name, model in vace_models(comfyui).items():
            assert type(model).__name__ == "VaceWanModel" and model.vace_layers_mapping == {0: 0, 2: 1}, name
            assert leftovers(model) == [], name
    for latents in (ours, native):
        assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    uncached = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **RUN)
    run_ok(comfyui, conditioned(uncached, ["16", "17"], "vace", image))
    assert not torch.equal(native[0], latent_of(comfyui, TRIMMED["native"])), "the MODEL node cached nothing"


def test_vace_experts_in_three_stages_equal_comfyuis_three_ksamplers_and_cached_keep_their_hints_fresh(
        comfyui, tiny_models, variant_experts, image):
    """The three-stage recipe on VACE-Fun A14B: a lead stage (24 steps of its own, CFG 3.5, handing over at the main
    schedule's step 1) on the high-noise expert, then the two main stages at CFG 1. Uncached it equals the same
    recipe built from three KSamplerAdvanced with WanVaceToVideo's conditioning, trimmed, bit for bit; cached,
    each of the three stages caches in a context of its own with every VACE block run on every call, seeds A, B, A
    repeat, and nothing stays on the models."""
    experts = (variant_experts[("vace", "high")], variant_experts[("vace", "low")])
    run = dict(lora=False, experts=experts, width=64, height=64, length=5)

    def ours(seed, cache=None):
        result = run_ok(comfyui, conditioned(three_stage_prompt(tiny_models, seed=seed, cache=cache, **run), ["5"],
                                             "vace", image))
        return report_of(result), latent_of(comfyui, TRIMMED["ours"])

    report, uncached = ours(3)
    assert report["split"] == {"lead": 3, "high": 3, "low": 4} and report["lead"]["hand_off_exact"] is True
    native = native_three_ksamplers(tiny_models, switch=1 + report["split"]["high"], seed=3, **run)
    run_ok(comfyui, conditioned(native, ["20", "16", "17"], "vace", image))
    assert torch.equal(uncached, latent_of(comfyui, TRIMMED["native"]))
    latents = []
    for seed in (3, 4, 3):
        report, latent = ours(seed, cache={**CACHING, "low_max_cached_steps": -1})
        for stage in ("lead", "high", "low"):
            stats = report["cache"][stage]
            assert stats["cached"] is True and stats["evaluations"] == report["split"][stage], (stage, stats)
            assert stats["vace_hints"] == "fresh", stats
            calls = stats["block_forwards_without_cache"] // 4  # the transformer calls (4 blocks each)
            assert stats["vace_block_forwards"] == tiny_wan.VACE_BLOCKS * calls, (stage, stats)
        assert any(report["cache"][stage]["cached_steps"] for stage in ("lead", "high", "low")), report["cache"]
        for name, model in diffusion_models(comfyui).items():
            assert model.vace_layers_mapping == {0: 0, 2: 1} and leftovers(model) == [], name
        latents.append(latent)
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    assert not torch.equal(latents[0], uncached)


def test_vace_experts_on_the_parallel_plan_are_refused_naming_the_experts(comfyui, variant_experts):
    high, low = variant_experts[("vace", "high")], variant_experts[("vace", "low")]
    prompt = {"1": loader(high, low),
              "50": {"class_type": "Wan22ParallelPlan", "inputs": {"experts": ["1", 0], "workers": 2,
                                                                   "devices": "auto", "ulysses_degree": 2,
                                                                   "cpu_threads": 0}},
              "51": {"class_type": "PreviewAny", "inputs": {"source": ["50", 0]}}}
    message = failed_at_run(comfyui, prompt)
    assert message.startswith("experts: the experts are VACE-Fun, whose control stream the parallel plan does not "
                              "split") and "without the Wan2.2 Parallel Plan node" in message, message


def identity_middle(tensors: dict) -> dict:
    """A tiny model's tensors with main blocks 1 and up made the identity (their attention outputs and last
    feed-forward layer zero: each adds exactly 0), so that all a cached step's residual carries is the hint after
    block 2."""
    zero = (".self_attn.o.", ".cross_attn.o.", ".ffn.2.")
    return {name: torch.zeros_like(t) if (name.startswith(tiny_wan.PREFIX + "blocks.") and
                                          not name.startswith(tiny_wan.PREFIX + "blocks.0.") and
                                          any(part in name for part in zero)) else t for name, t in tensors.items()}


def with_vace_hints(experts: dict, mode: str) -> dict:
    """bridged() experts with the probe node asking each MODEL's cached stages for `mode` VACE hints."""
    out = dict(experts)
    bridge = {**out["1"], "inputs": dict(out["1"]["inputs"])}
    for i, (name, source) in enumerate(sorted(bridge["inputs"].items())):
        out[f"9{i}"] = {"class_type": "Wan22TestVaceHints", "inputs": {"model": source, "mode": mode}}
        bridge["inputs"][name] = [f"9{i}", 0]
    out["1"] = bridge
    return out


def test_vace_fresh_hints_follow_the_control_on_cached_steps_where_cached_hints_lag(
        comfyui, tiny_models, image, probe_nodes):
    """On experts whose skippable main blocks add nothing but a hint, a cached step's output is the first block's
    plus the cached residual, the hint of the step it was computed on: "fresh" adds the change of that hint since,
    which makes the cached run the uncached one up to rounding; "cached" leaves it a step or more old. The same
    steps are cached either way, and "cached" runs the VACE blocks of skipped blocks only on computed steps."""
    names = {}
    for role, seed in (("high", 81), ("low", 91)):
        names[role] = f"wan2.2_fun_vace_identity_{role}_noise_14B_fp16.safetensors"
        save_file(identity_middle(tiny_wan.variant_tensors(tiny_wan.make_expert("t2v", seed), "vace")),
                  os.path.join(tiny_models["dir"], "diffusion_models", names[role]), metadata={"format": "pt"})
    runs = {}
    for mode in ("fresh", "cached", None):
        experts = bridged(names["high"], names["low"])
        prompt = our_prompt(with_vace_hints(experts, mode) if mode else experts, text_folder(tiny_models),
                            cache=CACHING if mode else None, **RUN)
        executor = comfyui.new_executor()  # the same prompt again, run again
        runs[mode] = (report_of(run_ok(comfyui, conditioned(prompt, ["5"], "vace", image), executor)),
                      latent_of(comfyui, TRIMMED["ours"], executor))
    uncached = runs[None][1]
    error = {mode: float((runs[mode][1] - uncached).norm() / uncached.norm()) for mode in ("fresh", "cached")}
    for role in ("high", "low"):
        fresh, cached = runs["fresh"][0]["cache"][role], runs["cached"][0]["cache"][role]
        assert fresh["cached_steps"] and fresh["cached_steps"] == cached["cached_steps"], (fresh, cached)
        calls = fresh["block_forwards_without_cache"] // 4
        assert fresh["vace_block_forwards"] == 2 * calls  # both VACE blocks on every call
        assert cached["vace_block_forwards"] == 2 * calls - len(cached["cached_steps"])  # block 2's: computed only
        # fresh hints keep one hidden state's size more (both prompts, batched): the skippable hints' sum
        tokens = runs["fresh"][1].shape[2] * 4 * 4 + 4 * 4  # the trimmed frames and the reference frame, 2x2 patches
        assert fresh["held_bytes"] - cached["held_bytes"] == 2 * tokens * 128 * 4, (fresh, cached)
    assert error["fresh"] < 1e-4 and error["cached"] > 100 * error["fresh"], error


@pytest.mark.parametrize("kind, class_name, drops", [("s2v", "WanModel_S2V", "the audio's change"),
                                                     ("animate", "AnimateWanModel", "the face's change")])
def test_s2v_and_animate_are_refused_by_the_cache_and_the_bridge_saying_what_a_cache_would_drop(
        comfyui, tiny_models, kind, class_name, drops):
    """S2V-14B and Animate-14B (tiny files from ComfyUI's own classes, loaded by Load Diffusion Model) add work
    between the blocks (the audio injector; the face adapter every fifth block), which a block cache runs as one
    unit: the Cache-DiT MODEL node refuses them naming the model and what a cached step would drop, and the
    experts bridge refuses them as no A14B expert, saying the same."""
    name = f"wan2.2_{kind}_14B_tiny_fp16.safetensors"
    tiny_wan.write_comfy_variant(os.path.join(tiny_models["dir"], "diffusion_models", name), kind)
    unet = {"class_type": "UNETLoader", "inputs": {"unet_name": name, "weight_dtype": "default"}}
    cached = {"10": unet, "60": cache_model_node(["10", 0]),
              "61": {"class_type": "PreviewAny", "inputs": {"source": ["60", 0]}}}
    message = failed_at_run(comfyui, cached)
    assert message.startswith(f"model: Wan2.2 Cache-DiT (MODEL) cannot cache {class_name}: ") and drops in message
    assert "run it without Cache-DiT, with ComfyUI's own nodes" in message, message
    bridge = {"10": unet, "70": {"class_type": "Wan22ExpertsFromModel", "inputs": {"high_noise_model": ["10", 0]}},
              "71": {"class_type": "PreviewAny", "inputs": {"source": ["70", 0]}}}
    message = failed_at_run(comfyui, bridge)
    assert message.startswith("high_noise_model: the MODEL given to high_noise_model is not a Wan2.2 A14B expert "
                              f"(it is a Wan {kind} model; and Cache-DiT could not cache it: ") and drops in message


def with_5b_latent(prompt: dict) -> dict:
    """The run's latent from Wan22ImageToVideoLatent, as the official TI2V-5B template makes it: 48 channels at a
    sixteenth of the size (its VAE input is read only for a start image)."""
    p = dict(prompt)
    p["113"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    p["4"] = {"class_type": "Wan22ImageToVideoLatent", "inputs": {"vae": ["113", 0], "width": 64, "height": 64,
                                                                  "length": 5, "batch_size": 1}}
    return p


def test_ti2v_5b_runs_alone_equal_to_comfyuis_ksampler_and_its_cache_repeats_and_leaves_nothing(comfyui, tiny_models):
    """TI2V-5B is one transformer: on either input of the bridge or the loader it takes every step, one stage
    bit-identical to ComfyUI's own KSampler graph on the same file (the official 5B template's shape), with one
    role's settings of the Cache-DiT node (the high-noise expert's) whichever input it came through; with the
    sampler's Cache-DiT, and with the Cache-DiT MODEL node on that KSampler, it caches, repeats bit for bit and
    leaves nothing on the model."""
    name = tiny_models["broken"]["wan_5b"]
    run = dict(sampler="euler", steps=6, flow_shift=5.0)
    for experts, split in ((bridged(low=name), {"high": 0, "low": 6}), (loader(high=name), {"high": 6, "low": 0})):
        report = report_of(run_ok(comfyui, with_5b_latent(our_prompt(experts, text_folder(tiny_models), seed=4,
                                                                     cfg=(3.5, 3.5), **run))))
        assert report["split"] == split
        ours = latent_of(comfyui, FINAL["ours"])
        assert ours.shape[1] == 48
        run_ok(comfyui, with_5b_latent(one_ksampler_prompt(name, text_folder(tiny_models), seed=4, cfg=3.5, **run)))
        assert torch.equal(ours, latent_of(comfyui, "17"))
    latents = []
    for seed in (4, 5, 4):
        # in the low-noise input it takes the high-noise expert's settings (one role, whichever input)
        report = report_of(run_ok(comfyui, with_5b_latent(our_prompt(loader(low=name), text_folder(tiny_models),
                                                                     seed=seed, cfg=(3.5, 3.5),
                                                                     cache={**CACHING, "low_max_cached_steps": 0},
                                                                     **run))))
        assert report["cache"]["low"]["cached_steps"], report["cache"]
        latents.append(latent_of(comfyui, FINAL["ours"]))
        assert all(leftovers(m) == [] for m in diffusion_models(comfyui).values())
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    # the Cache-DiT MODEL node on ComfyUI's own KSampler: caches (differs from the uncached run) and repeats
    native = []
    for seed, settings in ((4, None), (4, MODEL_CACHING), (5, MODEL_CACHING), (4, MODEL_CACHING)):
        graph = one_ksampler_prompt(name, text_folder(tiny_models), seed=seed, cfg=3.5, **run)
        run_ok(comfyui, with_5b_latent(with_model_caches(graph, high=settings)))
        native.append(latent_of(comfyui, "17"))
    assert not torch.equal(native[0], native[1]) and torch.equal(native[1], native[3])
    assert not torch.equal(native[1], native[2])
    assert leftovers(comfyui.cached_output("10")[0][0].model.diffusion_model) == []


@pytest.fixture
def wan22_vae(comfyui, tiny_models):
    """The Wan2.2 VAE (TI2V-5B's, 48 channels) in the models folder: ComfyUI builds it at full size whatever the
    file holds, so the stand-in is full size (1.4 GB, devtools/vae22_standin.py), written for the test and removed."""
    from devtools.standins import VAE22
    from devtools.vae22_standin import write_wan22_vae_standin

    path = write_wan22_vae_standin(os.path.join(tiny_models["dir"], "vae", VAE22))
    try:
        yield VAE22
    finally:
        os.remove(path)


def with_5b_start_image(prompt: dict, image: str, vae: str) -> dict:
    """The official TI2V-5B template's image-to-video graph: Wan22ImageToVideoLatent encodes the start image
    with the Wan2.2 VAE into the first latent frame and masks that frame out of the denoising (noise_mask)."""
    p = with_5b_latent(prompt)
    p["112"] = {"class_type": "LoadImage", "inputs": {"image": image}}
    p["113"] = {"class_type": "VAELoader", "inputs": {"vae_name": vae}}
    p["4"] = {**p["4"], "inputs": {**p["4"]["inputs"], "start_image": ["112", 0]}}
    return p


def test_ti2v_5b_with_a_start_image_equals_comfyuis_ksampler_keeps_the_image_and_its_cache_repeats(
        comfyui, tiny_models, image, wan22_vae):
    """TI2V-5B's image-to-video path, the official template's shape: Wan22ImageToVideoLatent's start image (its
    latent frame, its noise mask, so the model sees a timestep per frame). Uncached, our loader, schedule and
    sampler are bit-identical to ComfyUI's own KSampler graph on the same files and keep the start image's frame;
    cached, the run caches, keeps that frame, repeats bit for bit (seeds A, B, A) and leaves nothing on the model."""
    name = tiny_models["broken"]["wan_5b"]
    run = dict(sampler="euler", steps=6, flow_shift=5.0)

    def ours(seed, cache=None):
        prompt = our_prompt(loader(high=name), text_folder(tiny_models), seed=seed, cfg=(3.5, 3.5), cache=cache,
                            **run)
        result = run_ok(comfyui, with_5b_start_image(prompt, image, wan22_vae))
        return report_of(result), latent_of(comfyui, FINAL["ours"])

    report, uncached = ours(4)
    assert report["split"] == {"high": 6, "low": 0}
    start = comfyui.cached_output("4")[0][0]
    assert start["noise_mask"][:, :, 0].eq(0).all() and start["noise_mask"][:, :, 1:].eq(1).all()
    run_ok(comfyui, with_5b_start_image(one_ksampler_prompt(name, text_folder(tiny_models), seed=4, cfg=3.5, **run),
                                        image, wan22_vae))
    assert torch.equal(uncached, latent_of(comfyui, "17"))
    kept = start["samples"][:, :, :1]  # the masked frame comes back as it went in (up to the latent format's rounding)
    assert torch.allclose(uncached[:, :, :1], kept, atol=1e-5) and not torch.allclose(uncached[:, :, 1:],
                                                                                       start["samples"][:, :, 1:])
    latents = []
    for seed in (4, 5, 4):
        report, latent = ours(seed, cache=CACHING)
        assert report["cache"]["high"]["cached_steps"], report["cache"]
        assert torch.allclose(latent[:, :, :1], kept, atol=1e-5)
        assert all(leftovers(m) == [] for m in diffusion_models(comfyui).values())
        latents.append(latent)
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    assert not torch.equal(latents[0], uncached)


def test_a_vace_model_with_image_input_is_refused_by_the_cache_and_runs_without_it(
        comfyui, tiny_models, variant_experts, image, monkeypatch):
    """A newer ComfyUI marks a VACE checkpoint with image input (ID-V2V) `vace_image_input` and runs its VACE blocks
    on the text tokens alone, which the fresh hints do not: the cache refuses it by name; uncached it runs."""
    import comfy.ldm.wan.model

    monkeypatch.setattr(comfy.ldm.wan.model.VaceWanModel, "vace_image_input", True, raising=False)
    high, low = variant_experts[("vace", "high")], variant_experts[("vace", "low")]
    prompt = our_prompt(loader(high, low), text_folder(tiny_models), cache=CACHING, **RUN)
    message = failed_at_run(comfyui, conditioned(prompt, ["5"], "vace", image))
    assert message.startswith("enabled: the high-noise expert is a VACE model with image input")
    run_ok(comfyui, conditioned(our_prompt(loader(high, low), text_folder(tiny_models), **RUN), ["5"], "vace", image))
