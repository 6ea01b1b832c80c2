"""bench/peers.py's Spectrum (ComfyUI-Spectrum-WAN-Proper, an unmodified copy linked in where it is there) on the
template's graph of ComfyUI's own nodes, tiny random experts: it forecasts, every run is a first run, and it
leaves the loaded experts as they were (Spectrum itself patches objects every clone of an expert shares)."""

import os

import pytest
import torch

from bench import peers
from bench.common import text_embeddings

RUN = {"sampler": "uni_pc", "scheduler": "simple", "steps": 20, "shift": 8.0, "cfg": (4.0, 3.0)}


@pytest.fixture(scope="module")
def spectrum_bed(comfyui, tiny_models):
    """(the harness, role -> MODEL: the tiny t2v experts loaded by ComfyUI's own loader, this module's own), torch
    on one thread meanwhile (two threads on two shared cores run these tiny runs some 30 times slower)."""
    reason = peers.spectrum_missing()
    if reason:
        pytest.skip(reason)
    peers.spectrum_node(comfyui)
    import comfy.sd

    folder = os.path.join(tiny_models["dir"], "diffusion_models")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    names = {role: tiny_models["names"][("t2v", role, "fp32")] for role in ("high", "low")}
    yield comfyui, {role: comfy.sd.load_diffusion_model(os.path.join(folder, name)) for role, name in names.items()}
    torch.set_num_threads(threads)


def template_run(comfyui, models, patch=None):
    """(final latent, blocks run) of MODEL -> [patch] -> ModelSamplingSD3 -> KSamplerAdvanced per expert."""
    import nodes

    count = [0]
    hooks = [b.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
             for m in models.values() for b in m.model.diffusion_model.blocks]
    experts = comfyui.pack("nodes.expert_models").experts_handle(models)
    switch = comfyui.pack("nodes.sigmas").build_schedule(
        has_high=True, has_low=True, model_default=experts.default_boundary, sampler=RUN["sampler"],
        scheduler=RUN["scheduler"], steps=RUN["steps"], flow_shift=RUN["shift"]).high_steps
    patched = {role: patch(role, m) if patch else m for role, m in models.items()}
    shifted = {role: comfyui.pack("nodes.engine").shifted(m, RUN["shift"]) for role, m in patched.items()}
    positive, negative = [[text_embeddings(1), {}]], [[text_embeddings(2), {}]]
    common = (7, RUN["steps"])
    try:
        first = nodes.common_ksampler(shifted["high"], *common, RUN["cfg"][0], RUN["sampler"], RUN["scheduler"],
                                      positive, negative, {"samples": torch.zeros(1, 16, 1, 8, 8)}, denoise=1.0,
                                      disable_noise=False, start_step=0, last_step=switch, force_full_denoise=False)[0]
        out = nodes.common_ksampler(shifted["low"], *common, RUN["cfg"][1], RUN["sampler"], RUN["scheduler"], positive,
                                    negative, first, denoise=1.0, disable_noise=True, start_step=switch,
                                    last_step=10000, force_full_denoise=True)[0]["samples"]
    finally:
        for hook in hooks:
            hook.remove()
    return out, count[0]


def test_spectrum_forecasts_each_run_afresh_and_leaves_the_experts_as_they_were(spectrum_bed):
    comfyui, models = spectrum_bed
    before, blocks = template_run(comfyui, models)
    patch = peers.spectrum_patch(comfyui)
    first, first_blocks = template_run(comfyui, models, patch)
    second, second_blocks = template_run(comfyui, models, patch)
    after, after_blocks = template_run(comfyui, models)
    assert first_blocks < blocks and not torch.equal(first, before)  # it forecast some steps
    assert (second_blocks, second.tolist()) == (first_blocks, first.tolist())  # the second run was a first run too
    assert not any(peers.spectrum_patched(m) for m in models.values())
    assert after_blocks == blocks and torch.equal(after, before)  # an uncached run after it is as before it


def test_spectrum_defaults_are_its_nodes(spectrum_bed):
    node = peers.spectrum_node(spectrum_bed[0])
    required = node.INPUT_TYPES()["required"]
    assert peers.SPECTRUM_DEFAULTS == {k: v[1]["default"] for k, v in required.items() if k != "model"}


def test_a_spectrum_model_serves_one_sampling(spectrum_bed):
    comfyui, models = spectrum_bed
    patched = peers.spectrum_patch(comfyui, warmup_steps=8)("low", models["low"])
    template_run(comfyui, {"high": models["high"], "low": patched})
    with pytest.raises(RuntimeError, match="serves one sampling"):
        template_run(comfyui, {"high": models["high"], "low": patched})
    assert not peers.spectrum_patched(models["low"])
