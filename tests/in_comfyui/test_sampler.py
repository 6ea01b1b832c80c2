"""The two-stage sampler inside a real ComfyUI (in-process), with native nodes around it: decode, save,
image-to-video, the report and the timeline, and what it refuses."""

import collections
import dataclasses
import os

import numpy as np
import torch
from PIL import Image

from .cache_state import leftovers

from .prompts import (CACHING, FINAL, bridged, diffusion_models, expert_files, failed_at_run, latent_of,
                      loader, native_prompt, our_prompt, report_of, run_ok, text_folder, with_start_image)


def test_native_nodes_around_the_sampler_decode_and_save_a_video(comfyui, tiny_models):
    result = run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), sampler="euler",
                                        steps=8, flow_shift=12.0, decode=True))
    report = report_of(result)
    assert report["split"] == {"high": 6, "low": 2} and report["boundary_source"] == "model_default"
    assert report["expert_per_step"] == ["high"] * 6 + ["low"] * 2
    assert report["transformer_calls"] == {"high": 6, "low": 2}  # cond and uncond batched in one call
    assert report["forward_passes"] == {"high": 12, "low": 4}  # ... two passes each
    assert len(report["sigmas"]) == 9 and report["sigmas"][-1] == 0.0
    assert report["experts"] == dict(zip(("high", "low"), expert_files(tiny_models)))
    assert result.outputs["6"]["text"][0].startswith("{")  # the report, as JSON on a native node
    output_dir = comfyui.folder_paths.get_output_directory()
    with Image.open(os.path.join(output_dir, result.outputs["9"]["images"][0]["filename"])) as video:
        assert video.n_frames == 5 and video.size == (64, 64)
        assert np.asarray(video.convert("RGB"), dtype=np.float32).std() > 1.0  # a real decode, not a blank frame
    with Image.open(os.path.join(output_dir, result.outputs["19"]["images"][0]["filename"])) as picture:
        assert picture.size == (768, 300)
    assert result.outputs["5"]["text"][0].startswith("6 high / 2 low steps (euler/simple)")


def test_seeds_a_b_a_give_bit_identical_a_results(comfyui, tiny_models):
    results = []
    for seed in (5, 6, 5):
        run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=6, seed=seed))
        results.append(latent_of(comfyui, FINAL["ours"]))
    assert torch.equal(results[0], results[2]) and not torch.equal(results[0], results[1])


def test_cfg_one_runs_a_single_pass_per_step_on_that_expert(comfyui, tiny_models):
    report = report_of(run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models),
                                                  sampler="euler", steps=8, cfg=(4.0, 1.0))))
    assert report["transformer_calls"] == {"high": 6, "low": 2} and report["forward_passes"] == {"high": 12, "low": 2}


def test_a_latent_batch_gets_one_noise_per_item_and_the_text_is_shared(comfyui, tiny_models):
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=4, seed=3, batch=2))
    batch = latent_of(comfyui, FINAL["ours"])
    assert batch.shape[0] == 2 and not torch.equal(batch[0], batch[1])


def test_image_to_video_through_wan_image_to_video_equals_the_native_graph(comfyui, tiny_models, start_image):
    high, low = expert_files(tiny_models, "i2v")
    run = dict(sampler="uni_pc", steps=6, flow_shift=5.0, seed=4, cfg=(3.5, 3.5))
    report = report_of(run_ok(comfyui, with_start_image(our_prompt(bridged(high, low), text_folder(tiny_models), **run),
                                                        ["5"])))
    assert report["boundary_ratio"] == 0.9 and 0 < report["split"]["high"] < 6
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(high, low, text_folder(tiny_models), switch=report["split"]["high"], **run)
    run_ok(comfyui, with_start_image(native, ["16", "17"]))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_t2v_experts_given_i2v_conditioning_are_refused(comfyui, tiny_models, start_image):
    prompt = with_start_image(our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=4), ["5"])
    message = failed_at_run(comfyui, prompt)
    assert "positive: carries an image-to-video start image" in message and "load the Wan2.2 I2V experts" in message


def test_i2v_experts_without_a_start_image_are_refused(comfyui, tiny_models, start_image):
    prompt = our_prompt(loader(*expert_files(tiny_models, "i2v")), text_folder(tiny_models), steps=4)
    message = failed_at_run(comfyui, with_start_image(prompt, ["5"], with_image=False))
    assert "positive: the image-to-video experts need a start image" in message


def test_a_latent_the_experts_cannot_take_is_refused(comfyui, tiny_models):
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=4)
    prompt["4"] = {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    message = failed_at_run(comfyui, prompt)
    assert "latent_image: has shape [1, 16, 8, 8]" in message and "EmptyHunyuanLatentVideo" in message


def test_a_stage_is_refused_before_it_runs_when_comfyuis_sigmas_are_not_the_schedules(comfyui, tiny_models,
                                                                                     monkeypatch):
    """The split is counted from the schedule's sigmas; each stage checks that ComfyUI's sampling steps through
    exactly those (here the schedule's are nudged, as a change in ComfyUI's rules would make them differ)."""
    sigmas = comfyui.pack("nodes.sigmas")
    computed = sigmas.run_sigmas
    monkeypatch.setattr(sigmas, "run_sigmas", lambda *args: computed(*args) * 0.999)
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), sampler="euler", steps=4,
                        flow_shift=5.0, seed=31)
    result = comfyui.run(prompt, executor=comfyui.new_executor())
    message = result.execution_error()["exception_message"]
    assert message.startswith("schedule: ComfyUI's sampling would step the high-noise stage through the sigmas "
                              "[1.0, 0.9375, 0.833333], not the [0.999, 0.936563, 0.8325] the split was counted from")
    assert not any(event == "progress" and data.get("node") == "5" for event, data in result.messages)


def test_a_schedule_built_for_other_experts_is_refused(comfyui, tiny_models):
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=4)
    prompt["30"] = loader(low=expert_files(tiny_models)[1])
    prompt["2"]["inputs"]["experts"] = ["30", 0]
    assert "schedule: this schedule was built for other experts" in failed_at_run(comfyui, prompt)


def test_a_run_that_fails_in_its_second_stage_leaves_nothing_behind(comfyui, tiny_models, progress_hook):
    """A failure at the low-noise stage's first step, after both stages installed their cache and the LoRAs
    were patched in: nothing of the run stays on the experts, and the same prompt then gives what it gives on a
    fresh executor."""
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]}
    permissive = CACHING
    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), sampler="euler", steps=8,
                        flow_shift=12.0, seed=11, cache=permissive, lora=lora)  # 6 high / 2 low
    executor = comfyui.new_executor()
    progress_hook.append(progress_hook.failing_at("5", call=7))
    failed = comfyui.run(prompt, executor=executor)
    assert failed.valid and not failed.success
    assert "a failure in the middle of the run" in failed.execution_error()["exception_message"]
    progress_hook.clear()
    models = diffusion_models(comfyui, executor=executor)
    assert set(models) == {"high", "low"} and all(leftovers(m) == [] for m in models.values())
    run_ok(comfyui, prompt, executor)
    again = latent_of(comfyui, FINAL["ours"], executor)
    fresh = comfyui.new_executor()
    run_ok(comfyui, prompt, fresh)
    assert torch.equal(again, latent_of(comfyui, FINAL["ours"], fresh))


# What the pack holds on purpose, named by where: ComfyUI's memory stand-in for the warm pool
# (nodes/parallel/registry.py, WorkersInComfy: one tiny ModelPatcher for the process, never freed).
DELIBERATE = {"nodes.parallel.registry._STAND_IN.patcher"}
MAX_DEPTH = 6  # levels of containers and attributes below a module global


def pack_attributes(value) -> dict:
    """A pack object's attributes: its __dict__ (a class's own attributes), dataclass fields and slots."""
    found = {k: v for k, v in vars(value).items() if not k.startswith("__")} if hasattr(value, "__dict__") else {}
    if not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else []
        names += [slot for cls in type(value).__mro__ for slot in getattr(cls, "__slots__", ())]
        found.update({name: getattr(value, name) for name in names if hasattr(value, name)})
    return found


def models_held(value, where: str, pack: str, seen: set, depth: int = 0) -> list[str]:
    """Where `value` holds a torch module or a ModelPatcher: itself, or through containers and the pack's own
    objects and classes (their attributes, dataclass fields and slots), MAX_DEPTH levels down at most."""
    import weakref

    import comfy.model_patcher

    if isinstance(value, (torch.nn.Module, comfy.model_patcher.ModelPatcher)):
        return [where]
    if depth >= MAX_DEPTH or id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, (dict, weakref.WeakKeyDictionary, weakref.WeakValueDictionary)):
        items = list(value.items())
        parts = [(f"{where}[{k!r}]", v) for k, v in items] + [(f"{where} (a key)", k) for k, _ in items]
    elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        parts = [(f"{where}[{i}]", v) for i, v in enumerate(list(value))]
    elif str(getattr(value if isinstance(value, type) else type(value), "__module__", "")).startswith(pack + "."):
        parts = [(f"{where}.{name}", v) for name, v in pack_attributes(value).items()]
    else:
        return []
    return [found for part, v in parts for found in models_held(v, part, pack, seen, depth + 1)]


def models_in_the_pack(comfyui) -> set[str]:
    """Where the pack's modules hold a model, through their globals (models_held)."""
    import sys

    prefix = comfyui.pack_module.__name__
    modules = {name: module for name, module in list(sys.modules.items())
               if name == prefix or name.startswith(prefix + ".")}
    assert f"{prefix}.nodes.engine" in modules and f"{prefix}.nodes.text_nodes" in modules
    return {where for name, module in modules.items() for attr, value in vars(module).items()
            if not attr.startswith("__")
            for where in models_held(value, f"{name[len(prefix) + 1:]}.{attr}".lstrip("."), prefix, set())}


def test_two_runs_leave_no_pack_owned_registry_holding_a_model(comfyui, tiny_models):
    """Whatever a run installs lives on clones for that run: no module of the pack keeps an expert, a text
    encoder or a MODEL afterwards, in a global of its own or inside one of its objects; the warm pool's memory
    stand-in (there as after any parallel run) is the one model held on purpose, and is found."""
    lora = {"high": tiny_models["loras"]["high"], "low": tiny_models["loras"]["low"]}
    for seed in (1, 2):
        run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=6, seed=seed,
                                   cache={}, lora=lora))
    comfyui.pack("nodes.parallel.registry").stand_in()
    assert models_in_the_pack(comfyui) == DELIBERATE
