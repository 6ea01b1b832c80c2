"""What the loaders check before ComfyUI loads anything: safetensors headers, the architecture read off
the tensors, diffusers folders, and the rename of a diffusers transformer to ComfyUI's layout (no ComfyUI)."""

import dataclasses
import os
import shutil

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from devtools import tiny_wan
from wan22_cachedit.nodes.core import checkpoint
from wan22_cachedit.nodes.core import diffusers_folder as F
from wan22_cachedit.nodes.core.architecture import ExpertArchitecture, check_matching
from wan22_cachedit.nodes.core.errors import Wan22InputError


def dm(tiny, name):
    return os.path.join(tiny["dir"], "diffusion_models", name)


def folder(tiny, name):
    return os.path.join(tiny["dir"], "diffusers", name)


def refusal(call) -> Wan22InputError:
    with pytest.raises(Wan22InputError) as e:
        call()
    return e.value


def test_the_rename_to_comfyuis_layout_is_undone_exactly_by_diffusers_own_conversion():
    """diffusers' convert_wan_transformer_to_diffusers (original -> diffusers) is the oracle."""
    for task in ("t2v", "i2v"):
        model = tiny_wan.make_expert(task, 5)
        comfy = F.to_comfy_layout(model.state_dict())
        assert {"head.modulation", "head.head.weight", "blocks.0.norm3.weight", "blocks.0.modulation",
                "blocks.0.cross_attn.o.weight", "time_projection.1.weight"} <= set(comfy)
        back = convert_wan_transformer_to_diffusers({"model.diffusion_model." + k: v for k, v in comfy.items()})
        assert set(back) == set(model.state_dict())
        assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_a_vace_transformers_rename_is_undone_exactly_by_diffusers_own_conversion():
    """VACE's blocks (the trained VACE bed is a diffusers WanVACETransformer3DModel written in ComfyUI's layout):
    their projections and modulation get ComfyUI's names, which diffusers' conversion maps back."""
    from diffusers import WanVACETransformer3DModel

    torch.manual_seed(5)
    model = WanVACETransformer3DModel(**tiny_wan.tiny_config("t2v"), vace_layers=[0, 2], vace_in_channels=96)
    comfy = F.to_comfy_layout(model.state_dict())
    assert {"vace_blocks.0.before_proj.weight", "vace_blocks.1.after_proj.bias", "vace_blocks.1.modulation",
            "vace_blocks.1.norm3.weight", "vace_patch_embedding.weight"} <= set(comfy)
    back = convert_wan_transformer_to_diffusers({"model.diffusion_model." + k: v for k, v in comfy.items()})
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("fmt", tiny_wan.SINGLE_FILE_FORMATS)
@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_the_architecture_is_read_off_every_formats_header(tiny_models, fmt, task):
    architecture = checkpoint.expert_architecture(dm(tiny_models, tiny_models["names"][(task, "low", fmt)]), "x")
    assert architecture == ExpertArchitecture(dim=128, num_layers=4, in_channels={"t2v": 16, "i2v": 36}[task],
                                              out_channels=16, ffn_dim=256, text_dim=4096)
    assert architecture.task == task


def test_the_architecture_comes_from_the_tensors_not_the_file_name(tiny_models, tmp_path):
    misleading = tmp_path / "wan2.2_i2v_high_noise_14B_fp16.safetensors"
    shutil.copy(dm(tiny_models, tiny_models["names"][("t2v", "high", "fp16")]), misleading)
    assert checkpoint.expert_architecture(str(misleading), "high_noise_model").task == "t2v"
    wide = checkpoint.expert_architecture(dm(tiny_models, tiny_models["broken"]["wide"]), "low_noise_model")
    assert (wide.dim, wide.num_layers) == (256, 4)


def test_a_file_that_is_not_a_wan_transformer_is_refused(tiny_models):
    e = refusal(lambda: checkpoint.expert_architecture(dm(tiny_models, tiny_models["broken"]["not_wan"]),
                                                       "low_noise_model"))
    assert e.input_name == "low_noise_model" and "is not a Wan2.2 A14B expert" in str(e)
    assert "use a Wan2.2 high-noise or low-noise diffusion model" in str(e)


@pytest.mark.parametrize("which", ["truncated", "corrupt"])
def test_truncated_or_corrupt_files_are_refused_from_the_header(tiny_models, which):
    path = dm(tiny_models, tiny_models["broken"][which])
    with pytest.raises(checkpoint.CheckpointFileError, match=which):
        checkpoint.read_header(path)
    e = refusal(lambda: checkpoint.expert_architecture(path, "high_noise_model"))
    assert e.input_name == "high_noise_model" and which in str(e) and "download the file again" in str(e)


def test_a_missing_file_is_refused(tiny_models):
    e = refusal(lambda: checkpoint.check_file(dm(tiny_models, "nope.safetensors"), "high_noise_model"))
    assert e.input_name == "high_noise_model" and "file not found" in str(e) and "pick another" in str(e)


@pytest.mark.parametrize("low,label", [(("i2v", "low", "fp16"), "in-channels 16"), ("wide", "width 128"),
                                       ("shallow", "depth (layers) 4")])
def test_experts_that_do_not_match_are_refused_naming_the_difference(tiny_models, low, label):
    low_name = tiny_models["names"][low] if isinstance(low, tuple) else tiny_models["broken"][low]
    high_name = tiny_models["names"][("t2v", "high", "fp16")]
    architectures = {"high": checkpoint.expert_architecture(dm(tiny_models, high_name), "high_noise_model"),
                     "low": checkpoint.expert_architecture(dm(tiny_models, low_name), "low_noise_model")}
    e = refusal(lambda: check_matching(architectures, {"high": high_name, "low": low_name}))
    assert e.input_name == "low_noise_model" and "do not match" in str(e) and label in str(e)
    assert "same Wan2.2 model" in str(e)


def test_a_fun_camera_header_reads_as_image_to_video_with_its_adapter_and_matches_only_another(tmp_path):
    """A camera adapter (control_adapter.*) on the image-to-video layout: a Fun-Camera expert (the same task and
    boundary, told apart by `camera`); paired with a plain image-to-video expert, refused naming the adapter; on a
    text-to-video layout, not a Wan2.2 expert."""
    paths = {}
    for name, task, variant in (("camera", "i2v", "fun_camera"), ("t2v_camera", "t2v", "fun_camera"),
                                ("plain", "i2v", None)):
        model = tiny_wan.make_expert(task, 3)
        paths[name] = str(tmp_path / f"{name}.safetensors")
        (tiny_wan.write_variant(model, paths[name], variant) if variant else
         tiny_wan.write_single_file(model, paths[name], "fp16"))
    camera = checkpoint.expert_architecture(paths["camera"], "high_noise_model")
    assert camera.camera and camera.task == "i2v" and camera.label == "Fun-Camera"
    assert camera.describe().startswith("Fun-Camera image-to-video")
    plain = checkpoint.expert_architecture(paths["plain"], "low_noise_model")
    assert not plain.camera and camera == dataclasses.replace(plain, camera=True)
    e = refusal(lambda: check_matching({"high": camera, "low": plain}, {"high": "camera", "low": "plain"}))
    assert e.input_name == "low_noise_model" and "camera adapter True in camera vs False in plain" in str(e)
    assert "one is a Fun-Camera expert" in str(e)
    e = refusal(lambda: checkpoint.expert_architecture(paths["t2v_camera"], "high_noise_model"))
    assert "a camera adapter on a 16-channel model" in str(e) and e.input_name == "high_noise_model"


def test_a_vace_header_reads_as_text_to_video_with_its_vace_blocks_and_matches_only_another(tmp_path):
    """VACE-Fun's control stream (vace_patch_embedding.*, vace_blocks.*) on the text-to-video layout: a VACE-Fun
    expert (task t2v, boundary 0.875, told apart by its VACE block count); paired with a plain text-to-video
    expert, refused naming the VACE blocks; on another layout, or with half of the control stream, not an expert."""
    paths = {}
    for name, task, variant in (("vace", "t2v", "vace"), ("i2v_vace", "i2v", "vace"), ("plain", "t2v", None)):
        model = tiny_wan.make_expert(task, 3)
        paths[name] = str(tmp_path / f"{name}.safetensors")
        (tiny_wan.write_variant(model, paths[name], variant) if variant else
         tiny_wan.write_single_file(model, paths[name], "fp16"))
    vace = checkpoint.expert_architecture(paths["vace"], "high_noise_model")
    assert vace.vace_layers == tiny_wan.VACE_BLOCKS and vace.task == "t2v" and vace.label == "VACE-Fun"
    assert vace.describe() == "VACE-Fun text-to-video, width 128, 4 layers, 2 VACE blocks, 16 in-channels"
    plain = checkpoint.expert_architecture(paths["plain"], "low_noise_model")
    assert plain.vace_layers == 0 and vace == dataclasses.replace(plain, vace_layers=2)
    e = refusal(lambda: check_matching({"high": vace, "low": plain}, {"high": "vace", "low": "plain"}))
    assert e.input_name == "low_noise_model" and "VACE blocks 2 in vace vs 0 in plain" in str(e)
    assert "one is a VACE-Fun expert" in str(e)
    e = refusal(lambda: checkpoint.expert_architecture(paths["i2v_vace"], "high_noise_model"))
    assert "VACE blocks on a 36-channel model" in str(e) and e.input_name == "high_noise_model"
    tensors = tiny_wan.variant_tensors(tiny_wan.make_expert("t2v", 3), "vace")
    half = str(tmp_path / "half.safetensors")
    save_file({k: v for k, v in tensors.items() if "vace_patch_embedding" not in k}, half)
    e = refusal(lambda: checkpoint.expert_architecture(half, "low_noise_model"))
    assert "without both the VACE patch embedding and VACE blocks" in str(e) and e.input_name == "low_noise_model"


@pytest.mark.parametrize("choice,roles", [("both", {"high", "low"}), ("high_noise_only", {"high"}),
                                          ("low_noise_only", {"low"})])
def test_a_diffusers_folder_gives_the_requested_experts_and_its_declared_boundary(tiny_models, choice, roles):
    architectures, declared = F.inspect_folder(folder(tiny_models, tiny_models["names"][("i2v", "diffusers")]), choice)
    assert set(architectures) == roles and declared == 0.9
    assert all(a.task == "i2v" and a.num_layers == 4 for a in architectures.values())


def test_a_diffusers_folder_without_the_requested_expert_is_refused(tiny_models):
    path = folder(tiny_models, tiny_models["broken"]["diffusers_high_only"])
    e = refusal(lambda: F.inspect_folder(path, "both"))
    assert e.input_name == "experts" and "no transformer_2/" in str(e) and "high_noise_only" in str(e)
    assert set(F.inspect_folder(path, "high_noise_only")[0]) == {"high"}


def test_a_folder_without_model_index_is_refused(tmp_path):
    e = refusal(lambda: F.inspect_folder(str(tmp_path), "both"))
    assert e.input_name == "model_folder" and "model_index.json" in str(e)


def test_a_damaged_diffusers_folder_is_refused_naming_the_file(tiny_models, tmp_path):
    copy = tmp_path / "Wan2.2-damaged"
    shutil.copytree(folder(tiny_models, tiny_models["names"][("t2v", "diffusers")]), copy)
    weights = copy / "transformer_2" / "diffusion_pytorch_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    e = refusal(lambda: F.inspect_folder(str(copy), "both"))
    assert e.input_name == "model_folder" and "truncated" in str(e) and "download the folder again" in str(e)


@pytest.mark.parametrize("task", ["t2v", "i2v", "fun_control"])
def test_a_gguf_header_gives_the_architecture_its_safetensors_twin_gives(tmp_path, task):
    pytest.importorskip("gguf", reason="the gguf package (requirements-dev.txt) writes and reads GGUF files")
    model = tiny_wan.make_expert(task, 3)
    gguf_file = tiny_wan.write_gguf(model, str(tmp_path / "expert-Q8_0.gguf"), "Q8_0")
    twin = tiny_wan.write_single_file(model, str(tmp_path / "expert.safetensors"), "fp16")
    assert checkpoint.expert_architecture(gguf_file, "high_noise_model") == checkpoint.expert_architecture(
        twin, "high_noise_model")
    data = open(gguf_file, "rb").read()
    with open(tmp_path / "truncated.gguf", "wb") as f:
        f.write(data[: len(data) // 3])
    error = refusal(lambda: checkpoint.expert_architecture(str(tmp_path / "truncated.gguf"), "high_noise_model"))
    assert error.input_name == "high_noise_model" and "is not a readable GGUF file" in str(error)
