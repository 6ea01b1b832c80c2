"""The nodes inside a real ComfyUI (in-process): the split through the real nodes, counted from the sigmas
ComfyUI's own KSampler steps through, and every refusal coming back naming the input and the fix."""

import dataclasses

import pytest
import torch

from .prompts import (bridged, diffusers_loader, expert_files, failed_at_run, inputs_of_a_run, loader, refused_at_queue,
                      run_ok, schedule, schedule_prompt, split_of, text_folder)

NODE_IDS = ("Wan22ExpertLoader", "Wan22DiffusersExpertLoader", "Wan22ExpertsFromModel", "Wan22Schedule",
            "Wan22CacheDiT", "Wan22CacheBudget", "Wan22TwoStageSampler", "Wan22TextEncode", "Wan22LoraLoader")


def simple_split(steps, shift, boundary):
    """The split of euler/simple worked out on paper: step i starts at t = 1 - i/steps, shifted as
    sigma = shift t / (1 + (shift - 1) t), and is high-noise while sigma >= boundary."""
    high = sum(1 for i in range(steps) if shift * (1 - i / steps) / (1 + (shift - 1) * (1 - i / steps)) >= boundary)
    return high, steps - high


def test_the_pack_registers_its_nodes_with_a_tooltip_on_every_input(comfyui):
    for node_id in NODE_IDS:
        info = comfyui.nodes.NODE_CLASS_MAPPINGS[node_id].GET_NODE_INFO_V1()
        assert info["category"] == "Wan2.2 Cache-DiT"
        for section in ("required", "optional"):
            for name, spec in info["input"].get(section, {}).items():
                assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    schedule_info = comfyui.nodes.NODE_CLASS_MAPPINGS["Wan22Schedule"].GET_NODE_INFO_V1()
    assert schedule_info["output"] == ["WAN22_SCHEDULE", "INT", "INT", "SIGMAS", "SIGMAS"]


def test_the_sampler_and_scheduler_lists_are_comfyuis_own(comfyui):
    import comfy.samplers

    info = comfyui.nodes.NODE_CLASS_MAPPINGS["Wan22Schedule"].GET_NODE_INFO_V1()["input"]
    assert info["required"]["sampler"][1]["options"] == list(comfy.samplers.KSampler.SAMPLERS)
    assert info["optional"]["scheduler"][1]["options"] == list(comfy.samplers.KSampler.SCHEDULERS)
    assert info["optional"]["scheduler"][1]["default"] == "simple"


def test_comfyuis_weight_dtypes_are_offered_and_mean_what_load_diffusion_model_makes_of_them(comfyui, tiny_models,
                                                                                            monkeypatch):
    """The loaders offer ComfyUI's own Load Diffusion Model dtypes, with the model options its load_unet passes
    on (caught at comfy.sd.load_diffusion_model), beside the pack's fp32/bf16/fp16."""
    import comfy.sd

    loader_nodes = comfyui.pack("nodes.loader_nodes")
    unet_loader = comfyui.nodes.NODE_CLASS_MAPPINGS["UNETLoader"]
    theirs = unet_loader.INPUT_TYPES()["required"]["weight_dtype"][0]
    assert set(theirs) <= set(loader_nodes.WEIGHT_DTYPES)
    passed = []
    monkeypatch.setattr(comfy.sd, "load_diffusion_model", lambda path, model_options=None: passed.append(model_options))
    for name in theirs:
        unet_loader().load_unet(expert_files(tiny_models)[0], name)
        assert passed[-1] == loader_nodes.model_options(name), name


@pytest.mark.parametrize("sampler,steps,shift,expected", [
    # The values of the split vectors this project started from: ComfyUI's euler/simple (and dpmpp_2m) at 40 steps.
    ("euler", 40, 5.0, (17, 23)), ("euler", 40, 12.0, (26, 14)), ("dpmpp_2m", 40, 5.0, (17, 23)),
    ("euler", 20, 5.0, (9, 11)),  # the official template's 20-step mode, where it types 10 / 10 by hand
    ("euler", 4, 5.0, (2, 2)),  # its 4-step LightX2V mode
    # uni_pc drops the penultimate sigma of a one-step-longer schedule (KSampler's own rule), so its
    # sigmas sit a little higher than euler's: one more step stays above 0.875 at shift 5.
    ("uni_pc", 40, 5.0, (18, 22)), ("uni_pc", 40, 12.0, (26, 14)),
])
def test_t2v_experts_on_auto_split_as_comfyuis_own_sigmas_say(comfyui, tiny_models, sampler, steps, shift, expected):
    result = run_ok(comfyui, schedule_prompt(loader(*expert_files(tiny_models)), sampler=sampler, steps=steps,
                                             flow_shift=shift))
    assert split_of(result) == expected
    if sampler != "uni_pc":
        assert expected == simple_split(steps, shift, 0.875)
    assert result.outputs["2"]["split"][0]["boundary_ratio"] == 0.875
    assert result.outputs["3"]["text"] == [str(expected[0])]  # high_steps, read by a native node
    assert f"{expected[0]} high / {expected[1]} low" in result.outputs["2"]["text"][0]


@pytest.mark.parametrize("sampler,scheduler", [("uni_pc", "simple"), ("euler", "beta"), ("dpm_2", "karras"),
                                               ("dpmpp_2m", "sgm_uniform"), ("heun", "normal")])
def test_the_schedule_holds_the_very_sigmas_ksampler_computes_on_the_shifted_expert(comfyui, tiny_models, sampler,
                                                                                     scheduler):
    """ComfyUI's own path: ModelSamplingSD3 on the loaded MODEL, then KSampler's sigmas."""
    import comfy.samplers
    import comfy_extras.nodes_model_advanced as advanced

    prompt = schedule_prompt(bridged(*expert_files(tiny_models)), sampler=sampler, scheduler=scheduler, steps=13,
                             flow_shift=7.0)
    run_ok(comfyui, prompt)
    handle, _, _, sigmas_high, sigmas_low = (output[0] for output in comfyui.cached_output("2"))
    our_schedule = handle.schedule
    model = advanced.ModelSamplingSD3().patch(comfyui.cached_output("10")[0][0], 7.0)[0]
    theirs = comfy.samplers.KSampler(model, 13, "cpu", sampler, scheduler, denoise=1.0).sigmas
    assert our_schedule.sigmas == tuple(theirs.tolist())
    switch = our_schedule.high_steps
    assert torch.equal(sigmas_high, theirs[: switch + 1]) and torch.equal(sigmas_low, theirs[switch:])
    assert all(s >= 0.875 for s in theirs[:switch]) and all(s < 0.875 for s in theirs[switch:])


def test_i2v_experts_on_auto_use_the_i2v_boundary(comfyui, tiny_models):
    result = run_ok(comfyui, schedule_prompt(loader(*expert_files(tiny_models, "i2v", "fp8_scaled")), sampler="euler",
                                             flow_shift=5.0))
    assert split_of(result) == simple_split(40, 5.0, 0.9) == (15, 25)
    assert result.outputs["2"]["split"][0]["boundary_ratio"] == 0.9


@pytest.mark.parametrize("sampler", ["uni_pc", "euler", "dpmpp_2m"])
def test_one_expert_alone_gets_every_step(comfyui, tiny_models, sampler):
    high, low = expert_files(tiny_models)
    low_only = run_ok(comfyui, schedule_prompt(loader(low=low), sampler=sampler, steps=30, boundary="custom",
                                               boundary_ratio=1.0))
    assert split_of(low_only) == (0, 30)
    assert low_only.outputs["2"]["split"][0]["boundary_source"] == "low_noise_only"
    assert split_of(run_ok(comfyui, schedule_prompt(bridged(high=high), sampler=sampler, steps=30))) == (30, 0)


def test_a_diffusers_folder_through_the_node(comfyui, tiny_models):
    folder = tiny_models["names"][("i2v", "diffusers")]
    assert split_of(run_ok(comfyui, schedule_prompt(diffusers_loader(folder), sampler="euler", flow_shift=5.0))) == \
        simple_split(40, 5.0, 0.9)
    assert split_of(run_ok(comfyui, schedule_prompt(diffusers_loader(folder, "low_noise_only")))) == (0, 40)


@pytest.mark.parametrize("old,new", [("unipc", "uni_pc"), ("euler", "euler"), ("dpmpp", "dpmpp_2m")])
def test_a_prompt_saved_with_an_old_sampler_name_runs_with_its_comfyui_sampler(comfyui, tiny_models, old, new):
    prompt = schedule_prompt(loader(*expert_files(tiny_models)), sampler=old)
    del prompt["2"]["inputs"]["scheduler"]  # saved before the scheduler input existed
    result = run_ok(comfyui, prompt)
    assert result.outputs["2"]["text"][0].startswith(f"{new}/simple, 40 steps")
    assert split_of(result) == split_of(run_ok(comfyui, schedule_prompt(loader(*expert_files(tiny_models)),
                                                                        sampler=new)))


@pytest.mark.parametrize("ratio,expected", [(0.8, (31, 9)), (1.5, "boundary_ratio: 1.5 is outside [0, 1]")])
def test_an_api_prompt_saved_with_the_ratio_beside_the_boundary_still_runs(comfyui, tiny_models, ratio, expected):
    """Before the boundary became a dynamic input, API prompts carried boundary_ratio at the top level."""
    prompt = schedule_prompt(loader(*expert_files(tiny_models)), sampler="euler", flow_shift=12.0)
    prompt["2"]["inputs"].update(boundary="custom", boundary_ratio=ratio)
    if isinstance(expected, str):
        assert expected in refused_at_queue(comfyui, prompt, node="2")
    else:
        result = run_ok(comfyui, prompt)
        assert split_of(result) == expected == simple_split(40, 12.0, ratio)
        assert result.outputs["2"]["split"][0]["boundary_source"] == "custom"


def test_the_diffusers_text_encoder_is_loaded_by_comfyuis_model_management(comfyui, tiny_models, monkeypatch):
    """Wan22TextEncode hands its umt5 to load_models_gpu as a ModelPatcher, so ComfyUI makes room for it and
    offloads it like any model, and lets it go after the encoding."""
    import gc

    import comfy.model_management as mm
    import comfy.model_patcher

    loaded = []
    load_models_gpu = mm.load_models_gpu

    def recording(models, *args, **kwargs):
        for m in models:
            wrapped = type(getattr(m.model, "encoder", m.model)).__name__
            loaded.append((isinstance(m, comfy.model_patcher.ModelPatcher), wrapped, m.load_device))
        return load_models_gpu(models, *args, **kwargs)

    monkeypatch.setattr(mm, "load_models_gpu", recording)
    prompt = {"3": inputs_of_a_run(text_folder(tiny_models), prompt_text="a dog runs on the beach")["3"],
              "9": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}}}
    run_ok(comfyui, prompt, comfyui.new_executor())
    assert loaded == [(True, "UMT5EncoderModel", mm.text_encoder_device())]
    gc.collect()
    encoders = [m for m in mm.current_loaded_models if m.model is not None
                and type(getattr(m.model.model, "encoder", None)).__name__ == "UMT5EncoderModel"]
    assert encoders == []  # let go once the conditioning is made


def snapshot(handle):
    """Every field of a handle: MODELs by identity and by their patches, the rest by value."""
    out = []
    for f in dataclasses.fields(handle):
        value = getattr(handle, f.name)
        if hasattr(value, "patches"):
            value = (id(value), id(value.model), len(value.patches), repr(value.model_options))
        out.append((f.name, value))
    return out


def test_three_runs_on_one_handle_each_get_their_own_boundary_and_leave_it_unchanged(comfyui, tiny_models):
    prompt = schedule_prompt(loader(*expert_files(tiny_models)), sampler="euler", flow_shift=12.0)
    run_ok(comfyui, prompt)
    (handle,) = comfyui.cached_output("1")[0]
    before = snapshot(handle)
    splits = []
    for boundary, ratio in (("custom", 0.95), ("auto", 0.875), ("custom", 0.8)):
        prompt["2"] = schedule("1", sampler="euler", flow_shift=12.0, boundary=boundary, boundary_ratio=ratio)
        result = run_ok(comfyui, prompt)
        splits.append((split_of(result), result.outputs["2"]["split"][0]["boundary_source"]))
        (same,) = comfyui.cached_output("1")[0]
        assert same is handle  # the loader ran once; the schedule only read the handle
    assert [s for s, _ in splits] == [simple_split(40, 12.0, b) for b in (0.95, 0.875, 0.8)] == [(16, 24), (26, 14),
                                                                                                (31, 9)]
    assert [src for _, src in splits] == ["custom", "model_default", "custom"]
    assert snapshot(handle) == before


# --- refusals come back as node errors naming the input and the fix ---

def test_both_experts_none_is_a_node_error(comfyui):
    details = refused_at_queue(comfyui, schedule_prompt(loader()))
    assert "both 'none'" in details and "load at least one expert" in details


def test_a_missing_file_is_a_node_error(comfyui, tiny_models):
    prompt = schedule_prompt(loader(high="wan2.2_gone.safetensors", low=expert_files(tiny_models)[1]))
    details = refused_at_queue(comfyui, prompt)
    assert "high_noise_model: 'wan2.2_gone.safetensors' is not in models/diffusion_models" in details
    assert "put the file there" in details


@pytest.mark.parametrize("which,fragment", [
    ("not_wan", "is not a Wan2.2 A14B expert"), ("truncated", "is truncated"), ("corrupt", "corrupt")])
def test_a_bad_file_is_a_node_error(comfyui, tiny_models, which, fragment):
    details = refused_at_queue(comfyui, schedule_prompt(loader(low=tiny_models["broken"][which])))
    assert "low_noise_model:" in details and fragment in details
    assert "use a Wan2.2" in details or "download" in details


@pytest.mark.parametrize("low,label", [(("i2v", "low", "fp16"), "in-channels"), ("wide", "width"),
                                       ("shallow", "depth (layers)")])
def test_mismatched_experts_are_a_node_error_naming_the_difference(comfyui, tiny_models, low, label):
    low_name = tiny_models["names"][low] if isinstance(low, tuple) else tiny_models["broken"][low]
    details = refused_at_queue(comfyui, schedule_prompt(loader(high=expert_files(tiny_models)[0], low=low_name)))
    assert "low_noise_model: the experts do not match" in details and label in details


def test_a_diffusers_folder_without_the_expert_is_a_node_error(comfyui, tiny_models):
    folder = tiny_models["broken"]["diffusers_high_only"]
    details = refused_at_queue(comfyui, schedule_prompt(diffusers_loader(folder, "both")))
    assert "experts:" in details and "no transformer_2/" in details and "high_noise_only" in details


def test_a_symlinked_diffusers_folder_is_listed_and_loads(comfyui, tiny_models, tmp_path):
    """Models kept on another drive and linked into models/diffusers, as ComfyUI's folder_paths allows."""
    import os
    import shutil

    elsewhere = tmp_path / "other_drive" / "Wan2.2-I2V-elsewhere"
    shutil.copytree(os.path.join(tiny_models["dir"], "diffusers", tiny_models["names"][("i2v", "diffusers")]),
                    elsewhere)
    link = os.path.join(tiny_models["dir"], "diffusers", "Wan2.2-I2V-linked")
    os.symlink(elsewhere, link)
    try:
        listed = comfyui.pack("nodes.model_files").diffusers_folder_list()
        assert "Wan2.2-I2V-linked" in listed
        result = run_ok(comfyui, schedule_prompt(diffusers_loader("Wan2.2-I2V-linked"), sampler="euler",
                                                 flow_shift=5.0))
        assert split_of(result) == simple_split(40, 5.0, 0.9)
    finally:
        os.remove(link)


@pytest.mark.parametrize("inputs,fragment", [
    ({"steps": 0}, "Value 0 smaller than min of 1: steps"),
    ({"steps": 5000}, "Value 5000 bigger than max of 1000: steps"),
    ({"flow_shift": 0.0}, "Value 0.0 smaller than min of 0.01: flow_shift"),
    ({"boundary": "custom", "boundary_ratio": 1.5}, "Value 1.5 bigger than max of 1.0: boundary.boundary_ratio"),
    ({"boundary": "sometimes"}, "boundary: unknown mode 'sometimes': use 'auto' or 'custom'"),
    ({"sampler": "ddim_x"}, "sampler: unknown sampler 'ddim_x': use one of ComfyUI's KSampler samplers"),
    ({"scheduler": "cosine"}, "scheduler: unknown scheduler 'cosine': use one of simple, sgm_uniform"),
])
def test_out_of_range_schedule_values_are_refused_before_anything_runs(comfyui, tiny_models, inputs, fragment):
    details = refused_at_queue(comfyui, schedule_prompt(loader(*expert_files(tiny_models)), **inputs), node="2")
    assert fragment in details


def test_a_value_that_passes_the_widget_checks_but_is_invalid_fails_with_the_input_named(comfyui, tiny_models):
    message = failed_at_run(comfyui, schedule_prompt(loader(*expert_files(tiny_models)), flow_shift=float("nan")))
    assert "flow_shift: nan is not allowed: the flow shift must be greater than 0" in message


def test_a_refused_prompt_changes_nothing_for_the_next_one(comfyui, tiny_models):
    good = schedule_prompt(loader(*expert_files(tiny_models)), sampler="euler", flow_shift=5.0)
    assert split_of(run_ok(comfyui, good)) == (17, 23)
    refused_at_queue(comfyui, schedule_prompt(loader(*expert_files(tiny_models)), flow_shift=-1.0), node="2")
    refused_at_queue(comfyui, schedule_prompt(loader(expert_files(tiny_models)[0], tiny_models["broken"]["truncated"])))
    again = comfyui.run(good, executor=comfyui.new_executor())  # computed afresh, not from the cache
    assert again.success and split_of(again) == (17, 23)


def test_names_outside_the_model_folders_are_refused(comfyui, tiny_models):
    details = refused_at_queue(comfyui, schedule_prompt(loader(high="../../../../etc/passwd",
                                                               low=expert_files(tiny_models)[1])))
    assert "high_noise_model:" in details and "is not in models/diffusion_models" in details
    details = refused_at_queue(comfyui, schedule_prompt(diffusers_loader("../../..", "both")))
    assert "model_folder: '../../..' is not a folder under models/diffusers" in details


def test_loader_inputs_fed_by_links_validate_and_are_checked_when_they_run(comfyui, tiny_models):
    high, low = expert_files(tiny_models)
    switched = {f"9{i}": {"class_type": "ComfySwitchNode", "inputs": {"switch": True, "on_true": name,
                                                                     "on_false": "none"}}
                for i, name in ((1, high), (2, low))}
    prompt = schedule_prompt({**switched, "1": loader(["91", 0], ["92", 0])}, sampler="euler", flow_shift=5.0)
    assert split_of(run_ok(comfyui, prompt)) == (17, 23)
    prompt["92"]["inputs"]["on_true"] = tiny_models["broken"]["truncated"]
    assert "low_noise_model:" in failed_at_run(comfyui, prompt) and "truncated" in failed_at_run(comfyui, prompt)


# --- the MODEL bridge refuses what is not a pair of Wan2.2 A14B experts ---

def test_the_bridge_with_nothing_connected_is_refused(comfyui):
    message = failed_at_run(comfyui, schedule_prompt({"1": {"class_type": "Wan22ExpertsFromModel", "inputs": {}}}))
    assert "low_noise_model and high_noise_model are both unconnected" in message
    assert "connect the MODEL of at least one expert" in message


def test_a_model_that_is_not_a_wan_transformer_is_refused_naming_the_input(comfyui, tiny_models):
    message = failed_at_run(comfyui, schedule_prompt(bridged(low=tiny_models["broken"]["flux"])))
    assert message.startswith("low_noise_model: the MODEL given to low_noise_model is not a Wan 2.x transformer")
    assert "Flux" in message


def test_ti2v_5b_beside_an_expert_is_refused_as_one_transformer(comfyui, tiny_models):
    five_b = tiny_models["broken"]["wan_5b"]
    message = failed_at_run(comfyui, schedule_prompt(bridged(high=five_b, low=tiny_models["names"][("t2v", "low",
                                                                                                     "fp16")])))
    assert message.startswith("low_noise_model: ") and "is TI2V-5B, one transformer rather than a pair" in message


@pytest.mark.parametrize("low,fragment", [(("i2v", "low", "fp16"), "in-channels 16 in"), ("wide", "width 128 in"),
                                          ("shallow", "depth (layers) 4 in")])
def test_models_that_do_not_match_are_refused_naming_the_difference(comfyui, tiny_models, low, fragment):
    low_name = tiny_models["names"][low] if isinstance(low, tuple) else tiny_models["broken"][low]
    message = failed_at_run(comfyui, schedule_prompt(bridged(high=expert_files(tiny_models)[0], low=low_name)))
    assert message.startswith("low_noise_model: the experts do not match:") and fragment in message
    if low == ("i2v", "low", "fp16"):
        assert "one is text-to-video, the other image-to-video" in message
