"""The native engine inside a real ComfyUI (in-process): the experts are ComfyUI MODELs, and our schedule +
sampler give exactly what the official template's two KSamplerAdvanced give on the same files."""

import pytest
import torch

from .prompts import (FINAL, bridged, diffusers_loader, expert_files, latent_of, loader, native_prompt,
                      one_ksampler_prompt, our_prompt, report_of, run_ok, text_folder)

RUNS = {  # sampler, scheduler, steps, shift, cfg: the template's LightX2V set-up, the Wan default, three more
    "euler/simple": ("euler", "simple", 4, 5.0, (1.0, 1.0)),
    "uni_pc/simple": ("uni_pc", "simple", 10, 12.0, (4.0, 3.0)),
    "dpmpp_2m/beta": ("dpmpp_2m", "beta", 8, 5.0, (3.5, 3.5)),
    "euler_ancestral/simple": ("euler_ancestral", "simple", 8, 8.0, (4.0, 3.0)),
    # ComfyUI's ddim_uniform makes 13 sigmas of 11 steps: KSampler, and so the template, steps 12.
    "euler/ddim_uniform": ("euler", "ddim_uniform", 11, 5.0, (3.5, 3.5)),
}
LIGHTX2V_SIGMAS = [1.0, 0.9375, 0.833333, 0.625, 0.0]


def settings(name, seed=7):
    sampler, scheduler, steps, shift, cfg = RUNS[name]
    return dict(sampler=sampler, scheduler=scheduler, steps=steps, flow_shift=shift, cfg=cfg, seed=seed)


def ours_then_native(comfyui, tiny, experts, **run):
    """Our latent and the native graph's, with the native switch typed at the split our schedule reports."""
    high, low = expert_files(tiny)
    result = run_ok(comfyui, our_prompt(experts, text_folder(tiny), **run))
    ours = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    run_ok(comfyui, native_prompt(high, low, text_folder(tiny), switch=report["split"]["high"],
                                  loras=run.pop("native_loras", None), **run))
    return ours, latent_of(comfyui, FINAL["native"]), report


@pytest.mark.parametrize("name", list(RUNS))
def test_our_graph_is_bit_identical_to_two_ksampleradvanced_on_the_same_files(comfyui, tiny_models, name):
    high, low = expert_files(tiny_models)
    ours, native, report = ours_then_native(comfyui, tiny_models, bridged(high, low), **settings(name))
    assert 0 < report["split"]["high"] < report["steps"]  # both experts really ran
    assert torch.equal(ours, native)
    assert len(report["expert_per_step"]) == report["split"]["high"] + report["split"]["low"]  # every step ran
    if name == "euler/ddim_uniform":
        assert len(report["expert_per_step"]) == 12
    assert report["experts"] == {"high": high, "low": low}  # the files behind the MODELs, read off the prompt


def test_the_bridge_names_a_model_whose_file_the_prompt_does_not_show_as_model(comfyui, tiny_models):
    high, low = expert_files(tiny_models)
    prompt = our_prompt(bridged(high, low), text_folder(tiny_models), sampler="euler", steps=4, flow_shift=5.0)
    prompt["9"] = {"class_type": "ModelMergeSimple", "inputs": {"model1": ["10", 0], "model2": ["10", 0], "ratio": 0.5}}
    prompt["1"]["inputs"]["high_noise_model"] = ["9", 0]
    report = report_of(run_ok(comfyui, prompt))
    assert report["experts"] == {"high": "MODEL", "low": low}


def test_the_single_file_loader_gives_the_same_native_experts(comfyui, tiny_models):
    ours, native, _ = ours_then_native(comfyui, tiny_models, loader(*expert_files(tiny_models)),
                                       **settings("uni_pc/simple"))
    assert torch.equal(ours, native)


def test_the_official_template_set_up_splits_two_and_two_from_its_sigmas(comfyui, tiny_models):
    """euler/simple, 4 steps, shift 5: the sigmas LightX2V's 4-step LoRAs were distilled on."""
    result = run_ok(comfyui, our_prompt(bridged(*expert_files(tiny_models)), text_folder(tiny_models),
                                        **settings("euler/simple")))
    report = report_of(result)
    assert report["sigmas"] == pytest.approx(LIGHTX2V_SIGMAS, abs=1e-6)
    assert report["split"] == {"high": 2, "low": 2} and report["expert_per_step"] == ["high"] * 2 + ["low"] * 2
    assert report["transformer_calls"] == {"high": 2, "low": 2}  # CFG 1: one call per step
    assert (report["sampler"], report["scheduler"]) == ("euler", "simple")


@pytest.mark.parametrize("kind", ["single file", "MODEL", "diffusers folder"])
def test_the_lightx2v_schedule_is_the_same_on_every_kind_of_expert(comfyui, tiny_models, kind):
    high, low = expert_files(tiny_models)
    experts = {"single file": loader(high, low), "MODEL": bridged(high, low),
               "diffusers folder": diffusers_loader(text_folder(tiny_models))}[kind]
    report = report_of(run_ok(comfyui, our_prompt(experts, text_folder(tiny_models), **settings("euler/simple"))))
    assert report["sigmas"] == pytest.approx(LIGHTX2V_SIGMAS, abs=1e-6) and report["split"] == {"high": 2, "low": 2}


def test_a_diffusers_folder_runs_as_the_same_native_model_as_its_single_files(comfyui, tiny_models):
    """The tiny folder and the single files hold the same weights: one engine serves both."""
    run = settings("uni_pc/simple")
    run_ok(comfyui, our_prompt(diffusers_loader(text_folder(tiny_models)), text_folder(tiny_models), **run))
    from_folder = latent_of(comfyui, FINAL["ours"])
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models, fmt="fp32")), text_folder(tiny_models), **run))
    assert torch.equal(from_folder, latent_of(comfyui, FINAL["ours"]))


@pytest.mark.parametrize("role", ["low", "high"])
def test_one_expert_alone_equals_one_ksampler_on_it_for_all_steps(comfyui, tiny_models, role):
    name = dict(zip(("high", "low"), expert_files(tiny_models)))[role]
    run = dict(sampler="euler", scheduler="simple", steps=6, flow_shift=5.0, seed=3)
    experts = bridged(**{role: name})
    report = report_of(run_ok(comfyui, our_prompt(experts, text_folder(tiny_models), cfg=(3.5, 3.5), **run)))
    assert report["expert_per_step"] == [role] * 6 and report["boundary_source"] == f"{role}_noise_only"
    ours = latent_of(comfyui, FINAL["ours"])
    run_ok(comfyui, one_ksampler_prompt(name, text_folder(tiny_models), cfg=3.5, **run))
    assert torch.equal(ours, latent_of(comfyui, "17"))


def test_both_experts_are_placed_by_comfyuis_model_management(comfyui, tiny_models):
    import comfy.model_management as mm

    run_ok(comfyui, our_prompt(bridged(*expert_files(tiny_models)), text_folder(tiny_models),
                               **settings("uni_pc/simple")))
    (experts,) = comfyui.cached_output("1")[0]
    for model in (experts.high, experts.low):
        assert any(loaded.model.is_clone(model) for loaded in mm.current_loaded_models)


def native_ksampler(model, latent, positive, negative, seed):
    import nodes

    return nodes.KSampler().sample(model, seed, 4, 3.5, "euler", "simple", positive, negative, latent)[0]["samples"]


def test_a_native_ksampler_on_the_same_model_gives_what_it_gave_before_our_run(comfyui, tiny_models):
    """Handles are values: our run (shift, LoRA, Cache-DiT on clones of its own) leaves the MODEL as it was."""
    high, low = expert_files(tiny_models)
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]}
    prompt = our_prompt(bridged(high, low), text_folder(tiny_models), lora=lora, cache={"high_warmup_steps": 1},
                        **settings("uni_pc/simple"))
    run_ok(comfyui, prompt)
    model = comfyui.cached_output("10")[0][0]
    positive, negative = (comfyui.cached_output("3")[i][0] for i in (0, 1))
    latent = comfyui.cached_output("4")[0][0]
    before = native_ksampler(model, latent, positive, negative, 11)
    patches_before = dict(model.patches), dict(model.model_options.get("transformer_options", {}))
    prompt["5"]["inputs"]["seed"] = 8  # the sampler runs again, on the same MODEL objects
    run_ok(comfyui, prompt)
    assert comfyui.cached_output("10")[0][0] is model
    assert (dict(model.patches), dict(model.model_options.get("transformer_options", {}))) == patches_before
    assert torch.equal(native_ksampler(model, latent, positive, negative, 11), before)


def test_a_latents_noise_mask_is_honoured_as_ksampler_honours_it(comfyui, tiny_models):
    high, low = expert_files(tiny_models)
    run = settings("uni_pc/simple")
    mask = {"101": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 64, "height": 64}},
            "102": {"class_type": "SolidMask", "inputs": {"value": 0.0, "width": 32, "height": 64}},
            "103": {"class_type": "MaskComposite", "inputs": {"destination": ["101", 0], "source": ["102", 0],
                                                             "x": 0, "y": 0, "operation": "multiply"}},
            "104": {"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["4", 0], "mask": ["103", 0]}}}
    masked = []
    for prompt, final, latent_input in (
            (our_prompt(bridged(high, low), text_folder(tiny_models), **run), FINAL["ours"], "5"),
            (native_prompt(high, low, text_folder(tiny_models), switch=7, **run), FINAL["native"], "16")):
        prompt.update(mask)
        prompt[latent_input]["inputs"]["latent_image"] = ["104", 0]
        result = run_ok(comfyui, prompt)
        if final == FINAL["ours"]:
            assert report_of(result)["split"]["high"] == 7
        masked.append(latent_of(comfyui, final))
    assert torch.equal(masked[0], masked[1])
    run_ok(comfyui, our_prompt(bridged(high, low), text_folder(tiny_models), **run))
    unmasked = latent_of(comfyui, FINAL["ours"])
    assert not torch.equal(masked[0][..., :4], unmasked[..., :4])  # the mask's left half (8 latent px) is 0
