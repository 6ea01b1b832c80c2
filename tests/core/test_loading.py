"""Loading tiny experts from every real file format, and every refusal (no ComfyUI)."""

import os
import shutil

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

from devtools import tiny_wan
from wan22_cachedit.nodes.core import checkpoint
from wan22_cachedit.nodes.core import experts as E
from wan22_cachedit.nodes.core.errors import Wan22InputError
from wan22_cachedit.nodes.core.fp8 import Fp8ScaledLinear


def effective_state_dict(model):
    """The weights a model computes with: fp8 layers as their dequantised weight."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, Fp8ScaledLinear):
            state[f"{name}.weight"] = module.dequantized_weight()
            del state[f"{name}.scale"]
    return state


def dm(tiny, name):
    return os.path.join(tiny["dir"], "diffusion_models", name)


def forward(model, in_channels=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, in_channels, 2, 8, 8, generator=g)
    text = torch.randn(1, 16, 4096, generator=g)
    return model(x, torch.tensor([731.0]), text, return_dict=False)[0]


def rounded_like_file(model, fmt):
    """The fp32 weights as the file stores them: what loading must reproduce exactly."""
    expected = {}
    tensors, _ = tiny_wan.single_file_tensors(model, fmt)
    for name, value in model.state_dict().items():
        original = tiny_wan.to_original_layout({name: value})
        key = tiny_wan.PREFIX + next(iter(original))
        stored = tensors[key]
        if stored.dtype == torch.float8_e4m3fn:
            scale_key = key[: -len(".weight")] + (".scale_weight" if fmt == "fp8_scaled" else ".weight_scale")
            expected[name] = stored.float() * tensors[scale_key].float()
        else:
            expected[name] = stored.float()
    return expected


def test_the_writer_is_the_inverse_of_diffusers_conversion():
    model = tiny_wan.make_expert("i2v", 5)
    original = tiny_wan.to_original_layout(model.state_dict())
    assert "head.modulation" in original and "blocks.0.norm3.weight" in original
    back = convert_wan_transformer_to_diffusers({"model.diffusion_model." + k: v for k, v in original.items()})
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("fmt", tiny_wan.SINGLE_FILE_FORMATS)
@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_each_format_loads_to_the_diffusers_model_it_was_written_from(tiny_models, fmt, task):
    source = tiny_models["models"][(task, "low")]
    loaded = E.load_single_file_experts(None, dm(tiny_models, tiny_models["names"][(task, "low", fmt)]), "fp32")
    assert loaded.high_noise is None and loaded.low_noise is not None
    assert loaded.config.in_channels == source.config.in_channels and loaded.task == task
    expected = rounded_like_file(source, fmt)
    got = effective_state_dict(loaded.low_noise)
    fp8_layers = [m for m in loaded.low_noise.modules() if isinstance(m, Fp8ScaledLinear)]
    assert bool(fp8_layers) == fmt.startswith("fp8")  # fp8 stays fp8 in memory
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in fp8_layers)
    assert set(got) == set(expected)
    for name, value in expected.items():  # exactly the file's rounding, nothing more
        assert torch.equal(got[name], value), name
    out, ref = forward(loaded.low_noise, source.config.in_channels), forward(source, source.config.in_channels)
    if fmt == "fp32":
        assert torch.equal(out, ref)
    else:
        tolerance = {"fp16": 2e-3, "bf16": 2e-2, "fp8_scaled": 6e-2, "fp8_comfy_quant": 6e-2}[fmt]
        assert (out - ref).abs().max().item() <= tolerance * ref.abs().max().item()
        assert not torch.equal(out, ref)


def test_the_config_is_read_off_the_tensors_not_the_file_name(tiny_models, tmp_path):
    misleading = tmp_path / "wan2.2_i2v_high_noise_14B_fp16.safetensors"
    shutil.copy(dm(tiny_models, tiny_models["names"][("t2v", "high", "fp16")]), misleading)
    loaded = E.load_single_file_experts(str(misleading), None, "fp32")
    assert loaded.task == "t2v" and loaded.default_boundary == 0.875
    wide = E.inspect_single_file(dm(tiny_models, tiny_models["broken"]["wide"]), "low_noise_model")
    assert (wide.dim, wide.num_heads, wide.ffn_dim, wide.num_layers) == (256, 2, 256, 4)
    i2v = E.inspect_single_file(dm(tiny_models, tiny_models["names"][("i2v", "low", "fp8_scaled")]), "x")
    assert (i2v.in_channels, i2v.out_channels, i2v.task) == (36, 16, "i2v")


def test_weight_dtype_default_keeps_the_files_precision_and_fp8_computes_in_bf16(tiny_models):
    names = tiny_models["names"]
    fp16 = E.load_single_file_experts(dm(tiny_models, names[("t2v", "high", "fp16")]), None)
    assert fp16.dtype == torch.float16 and next(fp16.high_noise.parameters()).dtype == torch.float16
    fp8 = E.load_single_file_experts(None, dm(tiny_models, names[("t2v", "low", "fp8_comfy_quant")]))
    assert fp8.dtype == torch.bfloat16
    assert {p.dtype for p in fp8.low_noise.parameters()} == {torch.bfloat16, torch.float8_e4m3fn}
    assert {m.compute_dtype for m in fp8.low_noise.modules() if isinstance(m, Fp8ScaledLinear)} == {torch.bfloat16}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_fp8_layers_compute_exactly_as_weights_dequantised_at_load(tiny_models, dtype):
    import copy

    path = dm(tiny_models, tiny_models["names"][("t2v", "high", "fp8_scaled")])
    kept = E.load_single_file_experts(path, None, dtype).high_noise
    dequantised = copy.deepcopy(kept)
    for name, module in list(dequantised.named_modules()):
        if isinstance(module, Fp8ScaledLinear):
            linear = torch.nn.Linear(module.in_features, module.out_features, dtype=module.compute_dtype)
            linear.weight.data, linear.bias = module.dequantized_weight(), module.bias
            parent, _, child = name.rpartition(".")
            setattr(dequantised.get_submodule(parent), child, linear)
    def run(model):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 16, 2, 8, 8, generator=g).to(E.WEIGHT_DTYPES[dtype])
        text = torch.randn(1, 16, 4096, generator=g).to(E.WEIGHT_DTYPES[dtype])
        return model(x, torch.tensor([731.0]), text, return_dict=False)[0]

    out = run(kept)
    assert out.dtype == E.WEIGHT_DTYPES[dtype] and torch.equal(out, run(dequantised))


def test_both_experts_load_and_keep_their_own_weights(tiny_models):
    names = tiny_models["names"]
    loaded = E.load_single_file_experts(dm(tiny_models, names[("t2v", "high", "fp32")]),
                                        dm(tiny_models, names[("t2v", "low", "fp32")]), "fp32")
    assert torch.equal(forward(loaded.high_noise), forward(tiny_models["models"][("t2v", "high")]))
    assert torch.equal(forward(loaded.low_noise), forward(tiny_models["models"][("t2v", "low")]))
    assert loaded.sources == (names[("t2v", "high", "fp32")], names[("t2v", "low", "fp32")])


@pytest.mark.parametrize("choice,present", [("both", (True, True)), ("high_noise_only", (True, False)),
                                            ("low_noise_only", (False, True))])
def test_diffusers_folder_loads_the_requested_experts(tiny_models, choice, present):
    folder = os.path.join(tiny_models["dir"], "diffusers", tiny_models["names"][("i2v", "diffusers")])
    loaded = E.load_diffusers_experts(folder, choice, "fp32")
    assert (loaded.has_high, loaded.has_low) == present
    assert loaded.default_boundary == 0.9 and loaded.task == "i2v"
    for role, model in (("high", loaded.high_noise), ("low", loaded.low_noise)):
        if model is not None:
            assert torch.equal(forward(model, 36), forward(tiny_models["models"][("i2v", role)], 36))


# --- refusals: each names the input and says what to do ---

def refusal(call):
    with pytest.raises(Wan22InputError) as e:
        call()
    return e.value


def test_both_none_is_refused(tiny_models):
    e = refusal(lambda: E.load_single_file_experts(None, None))
    assert "both 'none'" in str(e) and "load at least one expert" in str(e)


def test_missing_file_is_refused(tiny_models):
    e = refusal(lambda: E.load_single_file_experts(dm(tiny_models, "nope.safetensors"), None))
    assert e.input_name == "high_noise_model" and "file not found" in str(e) and "pick another" in str(e)


def test_a_file_that_is_not_a_wan_transformer_is_refused(tiny_models):
    e = refusal(lambda: E.load_single_file_experts(None, dm(tiny_models, tiny_models["broken"]["not_wan"])))
    assert e.input_name == "low_noise_model" and "is not a Wan2.2 A14B transformer" in str(e)
    assert "pick a Wan2.2 high-noise or low-noise" in str(e)


@pytest.mark.parametrize("which", ["truncated", "corrupt"])
def test_truncated_or_corrupt_files_are_refused_before_loading(tiny_models, which):
    path = dm(tiny_models, tiny_models["broken"][which])
    with pytest.raises(checkpoint.CheckpointFileError, match=which):
        checkpoint.read_header(path)
    e = refusal(lambda: E.load_single_file_experts(path, None))
    assert e.input_name == "high_noise_model" and which in str(e) and "download the file again" in str(e)


@pytest.mark.parametrize("low,label", [(("i2v", "low", "fp16"), "in-channels 16"), ("wide", "width 128"),
                                       ("shallow", "depth (layers) 4")])
def test_experts_that_do_not_match_are_refused_naming_the_difference(tiny_models, low, label):
    low_name = tiny_models["names"][low] if isinstance(low, tuple) else tiny_models["broken"][low]
    high = dm(tiny_models, tiny_models["names"][("t2v", "high", "fp16")])
    e = refusal(lambda: E.load_single_file_experts(high, dm(tiny_models, low_name)))
    assert e.input_name == "low_noise_model" and "do not match" in str(e) and label in str(e)
    assert "same Wan2.2 model" in str(e)


def test_a_diffusers_folder_without_the_requested_expert_is_refused(tiny_models):
    folder = os.path.join(tiny_models["dir"], "diffusers", tiny_models["broken"]["diffusers_high_only"])
    e = refusal(lambda: E.load_diffusers_experts(folder, "both"))
    assert e.input_name == "experts" and "no transformer_2/" in str(e) and "high_noise_only" in str(e)
    assert E.load_diffusers_experts(folder, "high_noise_only", "fp32").has_high


def test_a_folder_without_model_index_is_refused(tmp_path):
    e = refusal(lambda: E.load_diffusers_experts(str(tmp_path), "both"))
    assert e.input_name == "model_folder" and "model_index.json" in str(e)


def test_an_unsupported_quantisation_format_is_refused(tiny_models, tmp_path):
    from safetensors.torch import load_file, save_file
    tensors = load_file(dm(tiny_models, tiny_models["names"][("t2v", "low", "fp8_comfy_quant")]))
    key = next(k for k in tensors if k.endswith(".comfy_quant"))
    tensors[key] = torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)
    save_file(tensors, tmp_path / "nvfp4.safetensors")
    e = refusal(lambda: E.load_single_file_experts(None, str(tmp_path / "nvfp4.safetensors")))
    assert "'nvfp4'" in str(e) and "fp16, bf16 or fp8" in str(e)


def test_loading_never_unpickles(tiny_models, monkeypatch):
    def no_pickle(*a, **k):
        raise AssertionError("torch.load was called")
    monkeypatch.setattr(torch, "load", no_pickle)
    names = tiny_models["names"]
    E.load_single_file_experts(dm(tiny_models, names[("t2v", "high", "fp16")]), None, "fp32")
    E.load_diffusers_experts(os.path.join(tiny_models["dir"], "diffusers", names[("t2v", "diffusers")]), "both")
