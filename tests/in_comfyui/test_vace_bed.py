"""The trained VACE bed (devtools/testbed.py's VACE-Fun config) on a quick version: trained as diffusers'
WanVACETransformer3DModel, written in ComfyUI's layout, it loads as ComfyUI's VaceWanModel and predicts there what
it was trained to predict, its control handed over as WanVaceToVideo hands it (bed_runs.vace_conditioning)."""

import torch

from devtools import testbed, tiny_wan
from devtools.bed_runs import vace_conditioning


def test_the_vace_beds_expert_in_comfyui_predicts_what_diffusers_trained(comfyui, tmp_path):
    import comfy.sd

    config = testbed.QUICK_VACE
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
