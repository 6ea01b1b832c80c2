"""The family's trained beds (devtools/testbed/'s FAMILY) on quick versions: the VACE-Fun expert, trained as
diffusers' WanVACETransformer3DModel and written in ComfyUI's layout, loads as ComfyUI's VaceWanModel and predicts
there what it was trained to predict, its control handed over as WanVaceToVideo hands it
(bed_runs.vace_conditioning); the TI2V-5B stand-in (one transformer, 48 channels) loads as ComfyUI's Wan2.2 5B
model, its latent format the Wan2.2 VAE's, and predicts what it was trained to."""

import torch

from devtools import testbed, tiny_wan
from devtools.bed_runs import vace_conditioning


def test_the_vace_beds_expert_in_comfyui_predicts_what_diffusers_trained(comfyui, tmp_path):
    import comfy.sd

    config = testbed.QUICKS["quick_vace"]
    state, _log = testbed.train_expert("low", config, log=lambda *_: None)
    trained = testbed.expert_model(config, state)
    patcher = comfy.sd.load_diffusion_model(tiny_wan.write_single_file(trained, str(tmp_path / "vace.safetensors"),
                                                                       "fp32"))
    comfy_model = patcher.model
    assert type(comfy_model.diffusion_model).__name__ == "VaceWanModel"
    assert comfy_model.diffusion_model.vace_layers_mapping == {i: k for k, i in enumerate(config.vace_layers)}
    world = testbed.World(config)
    x, t, _ctx, _v, control = testbed.flow_batch(world, "low", 2, torch.Generator().manual_seed(0), 0.0)
    context = world.context(1)
    for i in range(2):
        conds = comfy_model.extra_conds(noise=x[i:i + 1], **vace_conditioning(comfy_model.latent_format, control[i]))
        vace_context = conds["vace_context"].cond
        assert vace_context.shape == (1, 1, testbed.VACE_CHANNELS, *x.shape[2:])
        torch.testing.assert_close(vace_context[0, 0], control[i], rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            ours = comfy_model.diffusion_model(x[i:i + 1], t[i:i + 1], context, vace_context=vace_context,
                                               vace_strength=[1.0])
            theirs = trained(x[i:i + 1], t[i:i + 1], context, control_hidden_states=control[i:i + 1],
                             return_dict=False)[0]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
        other = world.control(1, *world.starts(1)[0])  # another track: another prediction (the control matters)
        with torch.no_grad():
            moved = comfy_model.diffusion_model(x[i:i + 1], t[i:i + 1], context, vace_context=other[None, None],
                                                vace_strength=[1.0])
        assert not torch.allclose(moved, ours, atol=1e-3)


def test_the_ti2v_beds_transformer_in_comfyui_is_the_5b_model_and_predicts_what_diffusers_trained(comfyui, tmp_path):
    import comfy.latent_formats
    import comfy.sd

    config = testbed.QUICKS["quick_ti2v"]
    assert config.single and config.roles == (testbed.SINGLE,)
    state, log = testbed.train_expert(testbed.SINGLE, config, log=lambda *_: None)
    trained = testbed.expert_model(config, state)
    patcher = comfy.sd.load_diffusion_model(tiny_wan.write_single_file(trained, str(tmp_path / "5b.safetensors"),
                                                                       "fp32"))
    assert isinstance(patcher.model.latent_format, comfy.latent_formats.Wan22)
    assert patcher.model.diffusion_model.patch_embedding.in_channels == testbed.SINGLE_CHANNELS
    world = testbed.World(config)
    x, t, _ctx, _v, control = testbed.flow_batch(world, testbed.SINGLE, 2, torch.Generator().manual_seed(0), 0.0)
    assert control is None and x.shape[1] == testbed.SINGLE_CHANNELS and float(t.min()) < 875  # every noise level
    with torch.no_grad():
        ours = patcher.model.diffusion_model(x, t, torch.cat([world.context(1)] * 2))
        theirs = trained(x, t, torch.cat([world.context(1)] * 2), return_dict=False)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
