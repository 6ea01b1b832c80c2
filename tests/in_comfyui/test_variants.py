"""The other Wan2.2 A14B variants through the bridge, on tiny stand-ins in ComfyUI's own layout with ComfyUI's
own conditioning nodes, against the native graph on the same files: Fun-InP (image-to-video layout, boundary
0.900) and Fun-Control (52 channels, a reference image's tokens in front of the sequence) run; VACE is refused
by name, saying why."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from .prompts import (CACHING, FINAL, TINY_VAE, bridged, diffusion_models, failed_at_run, latent_of, loader,
                      native_prompt, our_prompt, report_of, run_ok, text_folder)

RUN = dict(sampler="euler", steps=6, flow_shift=5.0, seed=4, cfg=(3.5, 3.5))
CONDITIONING = {  # ComfyUI's node for each variant, and its image inputs
    "fun_inpaint": ("WanFunInpaintToVideo", ("start_image",)),
    "fun_control": ("Wan22FunControlToVideo", ("ref_image", "control_video")),
}


@pytest.fixture
def image(comfyui):
    path = os.path.join(comfyui.folder_paths.get_input_directory(), "wan22_variant.png")
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return "wan22_variant.png"


def conditioned(prompt, samplers, variant, image):
    kind, images = CONDITIONING[variant]
    p = dict(prompt)
    p["112"] = {"class_type": "LoadImage", "inputs": {"image": image}}
    p["113"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    p["114"] = {"class_type": kind, "inputs": {"positive": ["3", 0], "negative": ["3", 1], "vae": ["113", 0],
                                               "width": 64, "height": 64, "length": 5, "batch_size": 1,
                                               **{name: ["112", 0] for name in images}}}
    for node in samplers:
        p[node] = {**p[node], "inputs": {**p[node]["inputs"], "positive": ["114", 0], "negative": ["114", 1]}}
    p[samplers[0]]["inputs"]["latent_image"] = ["114", 2]
    return p


@pytest.mark.parametrize("variant", sorted(CONDITIONING))
def test_fun_experts_run_through_the_bridge_equal_to_native(comfyui, tiny_models, variant_experts, image, variant):
    high, low = variant_experts[(variant, "high")], variant_experts[(variant, "low")]
    result = run_ok(comfyui, conditioned(our_prompt(bridged(high, low), text_folder(tiny_models), **RUN), ["5"],
                                         variant, image))
    report = report_of(result)
    assert report["boundary_ratio"] == 0.9 and 0 < report["split"]["high"] < RUN["steps"]
    model = diffusion_models(comfyui)["high"]
    assert model.patch_embedding.in_channels == {"fun_inpaint": 36, "fun_control": 52}[variant]
    assert (model.ref_conv is not None) == (variant == "fun_control")
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **RUN)
    run_ok(comfyui, conditioned(native, ["16", "17"], variant, image))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))
    report = report_of(run_ok(comfyui, conditioned(our_prompt(bridged(high, low), text_folder(tiny_models),
                                                              cache=CACHING, **RUN), ["5"], variant, image)))
    assert report["cache"]["high"]["cached_steps"] or report["cache"]["low"]["cached_steps"]


def test_fun_control_experts_without_their_control_latent_are_refused(comfyui, tiny_models, variant_experts):
    high, low = variant_experts[("fun_control", "high")], variant_experts[("fun_control", "low")]
    message = failed_at_run(comfyui, our_prompt(bridged(high, low), text_folder(tiny_models), **RUN))
    assert message.startswith("positive: the Fun-Control experts need their control latent") and (
        "Wan22FunControlToVideo" in message)


def test_vace_experts_are_refused_by_name_saying_why(comfyui, tiny_models, variant_experts):
    high, low = variant_experts[("vace", "high")], variant_experts[("vace", "low")]
    for prompt, node in ((our_prompt(bridged(high, low), text_folder(tiny_models), **RUN), None),
                         (our_prompt(loader(high, low), text_folder(tiny_models), **RUN), "1")):
        if node is None:
            message = failed_at_run(comfyui, prompt)
        else:
            result = comfyui.run(prompt)
            assert not result.valid
            message = " | ".join(result.node_error_details(node))
        assert "is a Wan2.2 VACE expert, which the pack refuses: VACE adds its control hints" in message, message
        assert "a block cache that skips those blocks would drop the hints" in message
