"""The nodes inside a real ComfyUI (in-process): the split through the real node, and every refusal
coming back as a node error that names the input and the fix."""

import dataclasses

import pytest

from .prompts import diffusers_loader, loader, schedule, schedule_prompt, split_of

NODE_IDS = ("Wan22ExpertLoader", "Wan22DiffusersExpertLoader", "Wan22Schedule", "Wan22CacheDiT",
            "Wan22TwoStageSampler", "Wan22TextEncode", "Wan22LoraLoader")


def names(tiny, task="t2v", fmt="fp16"):
    return tiny["names"][(task, "high", fmt)], tiny["names"][(task, "low", fmt)]


def run_ok(comfyui, prompt):
    result = comfyui.run(prompt)
    assert result.valid, result.node_errors
    assert result.success, result.execution_error()
    return result


def test_the_pack_registers_its_nodes_with_a_tooltip_on_every_input(comfyui):
    for node_id in NODE_IDS:
        cls = comfyui.nodes.NODE_CLASS_MAPPINGS[node_id]
        info = cls.GET_NODE_INFO_V1()
        assert info["category"] == "Wan2.2 Cache-DiT"
        for name, spec in info["input"]["required"].items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert comfyui.nodes.NODE_CLASS_MAPPINGS["Wan22Schedule"].GET_NODE_INFO_V1()["output"] == [
        "WAN22_SCHEDULE", "INT", "INT"]


@pytest.mark.parametrize("shift,expected", [(5.0, (17, 23)), (12.0, (26, 14))])
def test_t2v_experts_on_auto_split_as_the_schedule_says(comfyui, tiny_models, shift, expected):
    high, low = names(tiny_models)
    result = run_ok(comfyui, schedule_prompt(loader(high, low), flow_shift=shift))
    assert split_of(result) == expected
    assert result.outputs["2"]["split"][0]["boundary_ratio"] == 0.875
    assert result.outputs["3"]["text"] == [str(expected[0])]  # high_steps, read by a native node
    assert f"{expected[0]} high / {expected[1]} low" in result.outputs["2"]["text"][0]


def test_i2v_experts_on_auto_use_the_i2v_boundary(comfyui, tiny_models):
    high, low = names(tiny_models, "i2v", "fp8_scaled")
    result = run_ok(comfyui, schedule_prompt(loader(high, low), flow_shift=5.0))
    assert split_of(result) == (15, 25)
    assert result.outputs["2"]["split"][0]["boundary_ratio"] == 0.9


@pytest.mark.parametrize("sampler", ["unipc", "euler", "dpmpp"])
def test_one_expert_alone_gets_every_step(comfyui, tiny_models, sampler):
    high, low = names(tiny_models)
    low_only = run_ok(comfyui, schedule_prompt(loader(low=low), sampler=sampler, steps=30, boundary="custom",
                                             boundary_ratio=1.0))
    assert split_of(low_only) == (0, 30)
    assert low_only.outputs["2"]["split"][0]["boundary_source"] == "low_noise_only"
    high_only = run_ok(comfyui, schedule_prompt(loader(high=high), sampler=sampler, steps=30))
    assert split_of(high_only) == (30, 0)


def test_diffusers_folder_through_the_node(comfyui, tiny_models):
    folder = tiny_models["names"][("i2v", "diffusers")]
    assert split_of(run_ok(comfyui, schedule_prompt(diffusers_loader(folder), flow_shift=5.0))) == (15, 25)
    assert split_of(run_ok(comfyui, schedule_prompt(diffusers_loader(folder, "low_noise_only")))) == (0, 40)


def snapshot(handle):
    """Every field of a handle: modules by identity and by weights, the rest by value."""
    out = []
    for f in dataclasses.fields(handle):
        value = getattr(handle, f.name)
        if hasattr(value, "state_dict"):
            value = (id(value), tuple((k, v.sum().item()) for k, v in value.state_dict().items()))
        out.append((f.name, value))
    return out


def test_three_runs_on_one_handle_each_get_their_own_boundary_and_leave_it_unchanged(comfyui, tiny_models):
    high, low = names(tiny_models)
    prompt = schedule_prompt(loader(high, low), flow_shift=12.0)
    run_ok(comfyui, prompt)
    (handle,) = comfyui.cached_output("1")[0]
    before = snapshot(handle)
    splits = []
    for boundary, ratio in (("custom", 0.95), ("auto", 0.875), ("custom", 0.8)):
        prompt["2"] = schedule("1", flow_shift=12.0, boundary=boundary, boundary_ratio=ratio)
        result = run_ok(comfyui, prompt)
        splits.append((split_of(result), result.outputs["2"]["split"][0]["boundary_source"]))
        (same,) = comfyui.cached_output("1")[0]
        assert same is handle  # the loader ran once; the schedule only read the handle
    expected = [comfyui.pack("nodes.core.schedule").build_schedule(
        sampler="unipc", steps=40, flow_shift=12.0, has_high=True, has_low=True, model_default=0.875,
        custom_ratio=r).split for r in (0.95, None, 0.8)]
    assert [s for s, _ in splits] == expected
    assert expected[0] != expected[1] != expected[2]
    assert [src for _, src in splits] == ["custom", "model_default", "custom"]
    assert snapshot(handle) == before


# --- refusals come back from validation as node errors naming the input and the fix ---

def refused(comfyui, prompt, node="1"):
    result = comfyui.run(prompt)
    assert not result.valid, "the prompt should have been refused"
    assert node in result.node_errors, result.node_errors
    return " | ".join(result.node_error_details(node))


def test_both_experts_none_is_a_node_error(comfyui):
    details = refused(comfyui, schedule_prompt(loader()))
    assert "both 'none'" in details and "load at least one expert" in details


def test_a_missing_file_is_a_node_error(comfyui, tiny_models):
    details = refused(comfyui, schedule_prompt(loader(high="wan2.2_gone.safetensors", low=names(tiny_models)[1])))
    assert "high_noise_model: 'wan2.2_gone.safetensors' is not in models/diffusion_models" in details
    assert "put the file there" in details


@pytest.mark.parametrize("which,fragment", [
    ("not_wan", "is not a Wan2.2 A14B transformer"),
    ("truncated", "is truncated"),
    ("corrupt", "corrupt"),
])
def test_a_bad_file_is_a_node_error(comfyui, tiny_models, which, fragment):
    details = refused(comfyui, schedule_prompt(loader(low=tiny_models["broken"][which])))
    assert "low_noise_model:" in details and fragment in details
    assert "pick" in details or "download" in details


@pytest.mark.parametrize("low,label", [(("i2v", "low", "fp16"), "in-channels"), ("wide", "width"),
                                       ("shallow", "depth (layers)")])
def test_mismatched_experts_are_a_node_error_naming_the_difference(comfyui, tiny_models, low, label):
    low_name = tiny_models["names"][low] if isinstance(low, tuple) else tiny_models["broken"][low]
    details = refused(comfyui, schedule_prompt(loader(high=names(tiny_models)[0], low=low_name)))
    assert "low_noise_model: the experts do not match" in details and label in details


def test_a_diffusers_folder_without_the_expert_is_a_node_error(comfyui, tiny_models):
    folder = tiny_models["broken"]["diffusers_high_only"]
    details = refused(comfyui, schedule_prompt(diffusers_loader(folder, "both")))
    assert "experts:" in details and "no transformer_2/" in details and "high_noise_only" in details


@pytest.mark.parametrize("inputs,fragment", [
    ({"steps": 0}, "Value 0 smaller than min of 1: steps"),
    ({"steps": 5000}, "Value 5000 bigger than max of 1000: steps"),
    ({"flow_shift": 0.0}, "Value 0.0 smaller than min of 0.01: flow_shift"),
    ({"flow_shift": -2.0}, "Value -2.0 smaller than min of 0.01: flow_shift"),
    ({"boundary": "custom", "boundary_ratio": 1.5}, "Value 1.5 bigger than max of 1.0: boundary_ratio"),
    ({"sampler": "ddim"}, "Value not in list: sampler: 'ddim' not in ['unipc', 'euler', 'dpmpp']"),
])
def test_out_of_range_schedule_values_are_refused_before_anything_runs(comfyui, tiny_models, inputs, fragment):
    high, low = names(tiny_models)
    details = refused(comfyui, schedule_prompt(loader(high, low), **inputs), node="2")
    assert fragment in details


def test_a_value_that_passes_the_widget_checks_but_is_invalid_fails_with_the_input_named(comfyui, tiny_models):
    high, low = names(tiny_models)
    result = comfyui.run(schedule_prompt(loader(high, low), flow_shift=float("nan")), executor=comfyui.new_executor())
    assert result.valid and not result.success
    assert "flow_shift: nan is not allowed: the flow shift must be greater than 0" in \
        result.execution_error()["exception_message"]


def test_a_refused_prompt_changes_nothing_for_the_next_one(comfyui, tiny_models):
    high, low = names(tiny_models)
    good = schedule_prompt(loader(high, low), flow_shift=5.0)
    assert split_of(run_ok(comfyui, good)) == (17, 23)
    refused(comfyui, schedule_prompt(loader(high, low), flow_shift=-1.0), node="2")
    refused(comfyui, schedule_prompt(loader(high, tiny_models["broken"]["truncated"])))
    again = comfyui.run(good, executor=comfyui.new_executor())  # computed afresh, not from the cache
    assert again.success and split_of(again) == (17, 23)


def test_names_outside_the_model_folders_are_refused(comfyui, tiny_models):
    low = tiny_models["names"][("t2v", "low", "fp16")]
    details = refused(comfyui, schedule_prompt(loader(high="../../../../etc/passwd", low=low)))
    assert "high_noise_model:" in details and "is not in models/diffusion_models" in details
    details = refused(comfyui, schedule_prompt(diffusers_loader("../../..", "both")))
    assert "model_folder: '../../..' is not a folder under models/diffusers" in details
