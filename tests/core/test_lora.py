"""LoRA per expert on tiny experts (no ComfyUI): diffusers' own LoRA loading and ComfyUI's LoRA
arithmetic as oracles, strength 0, per-expert isolation, reconciling between runs, errors."""

import os

import pytest
import torch
from diffusers import WanPipeline
from safetensors.torch import load_file

from devtools import tiny_wan
from wan22_cachedit.nodes.core import cache as C
from wan22_cachedit.nodes.core import denoise as D
from wan22_cachedit.nodes.core import lora as L
from wan22_cachedit.nodes.core import schedule as S
from wan22_cachedit.nodes.core.errors import Wan22InputError
from .handles import handle

SEEDS = {"high": 31, "low": 32}
SHAPE = (1, 16, 2, 16, 16)


def fresh_pair(num_layers=4):
    return (tiny_wan.make_expert("t2v", SEEDS["high"], num_layers=num_layers),
            tiny_wan.make_expert("t2v", SEEDS["low"], num_layers=num_layers))


@pytest.fixture
def pair():
    high, low = fresh_pair()
    yield high, low
    for module in (high, low):
        L.remove(module)
        C.remove(module)


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory):
    """One LoRA per expert and format, written from experts of the same architecture."""
    folder = tmp_path_factory.mktemp("loras")
    model = tiny_wan.make_expert("t2v", 0)
    files = {}
    for fmt in tiny_wan.LORA_FORMATS:
        for role, seed in (("high", 41), ("low", 42)):
            files[(fmt, role)] = tiny_wan.write_tiny_lora(model, str(folder / f"{fmt}_{role}.safetensors"), fmt,
                                                          seed=seed)
    files["wide"] = tiny_wan.write_tiny_lora(tiny_wan.make_expert("t2v", 0, dim=256), str(folder / "wan_5b.safetensors"))
    files["expert"] = tiny_wan.write_single_file(model, str(folder / "not_a_lora.safetensors"), "fp16")
    data = open(files[("comfy", "high")], "rb").read()
    files["truncated"] = str(folder / "truncated.safetensors")
    with open(files["truncated"], "wb") as f:
        f.write(data[: len(data) // 2])
    return files


def use(files, fmt, role, strength=1.0, dtype=torch.float32):
    return L.LoraUse(role, L.read_lora(files[(fmt, role)], L.LORA_INPUTS[role], dtype), strength)


def run_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return D.DenoiseInputs(positive=torch.randn(1, 24, 4096, generator=g),
                           negative=torch.randn(1, 24, 4096, generator=g), noise=torch.randn(SHAPE, generator=g))


def template_schedule(experts, steps=4):
    """The official Wan2.2 LightX2V set-up: 4 euler steps, shift 5, boundary auto (0.875) -> 2 / 2."""
    return S.build_schedule(sampler="euler", steps=steps, flow_shift=5.0, has_high=experts.has_high,
                            has_low=experts.has_low, model_default=0.875)


def forward(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, e = torch.randn(SHAPE, generator=g), torch.randn(1, 24, 4096, generator=g)
    with torch.no_grad():
        return module(hidden_states=x, timestep=torch.tensor([700.0]), encoder_hidden_states=e, return_dict=False)[0]


def comfy_merge(model, path, strength):
    """ComfyUI's LoRA arithmetic, by hand: W += s * alpha/rank * up @ down, b += s * diff_b, W += s * diff."""
    import copy

    merged = copy.deepcopy(model)
    weights = {k: v.float() for k, v in load_file(path).items()}
    params = tiny_wan.to_original_layout(dict(merged.state_dict()))  # original name -> the model's own tensor
    with torch.no_grad():
        for key, down in weights.items():
            layer = key[len("diffusion_model."):]
            if layer.endswith(".lora_down.weight"):
                base = layer[: -len(".lora_down.weight")]
                up = weights[f"diffusion_model.{base}.lora_up.weight"]
                alpha = weights[f"diffusion_model.{base}.alpha"].item()
                params[base + ".weight"] += strength * alpha / down.shape[0] * (up @ down)
            elif layer.endswith(".diff_b"):
                params[layer[: -len(".diff_b")] + ".bias"] += strength * down
            elif layer.endswith(".diff"):
                params[layer[: -len(".diff")] + ".weight"] += strength * down
    return merged


@pytest.mark.parametrize("steps,sampler,cfg", [(4, "euler", (1.0, 1.0)), (8, "unipc", (4.0, 3.0))])
def test_comfy_format_equals_diffusers_own_lora_loading(pair, lora_files, steps, sampler, cfg):
    high, low = pair
    experts = handle(high, low, loras=[use(lora_files, "comfy", "high", 1.0), use(lora_files, "comfy", "low", 0.7)])
    schedule = S.build_schedule(sampler=sampler, steps=steps, flow_shift=5.0, has_high=True, has_low=True,
                                model_default=0.875)
    ours, record = D.denoise(experts, schedule, run_inputs(), *cfg)
    assert record.split == ((2, 2) if steps == 4 else schedule.split)

    ref_high, ref_low = fresh_pair()
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=S.SAMPLERS[sampler](5.0),
                       transformer=ref_high, transformer_2=ref_low, boundary_ratio=0.875)
    pipe.load_lora_weights(lora_files[("comfy", "high")], adapter_name="h")
    pipe.load_lora_weights(lora_files[("comfy", "low")], adapter_name="l", load_into_transformer_2=True)
    ref_low.set_adapters(["l"], weights=[0.7])
    pipe.set_progress_bar_config(disable=True)
    inputs = run_inputs()
    ref = pipe(prompt_embeds=inputs.positive, negative_prompt_embeds=inputs.negative, latents=inputs.noise.clone(),
               num_inference_steps=steps, guidance_scale=cfg[0], guidance_scale_2=cfg[1], output_type="latent",
               height=SHAPE[3] * 8, width=SHAPE[4] * 8, num_frames=(SHAPE[2] - 1) * 4 + 1).frames
    baseline, _ = D.denoise(handle(*fresh_pair()), schedule, run_inputs(), *cfg)
    assert (ours - baseline).abs().max().item() > 1e-3  # the LoRAs really change the run
    assert (ours - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("fmt", tiny_wan.LORA_FORMATS)
def test_every_format_applies_comfyuis_lora_arithmetic(pair, lora_files, fmt):
    """ComfyUI/kohya, LightX2V (with bias and head differences), musubi and diffusers/PEFT files all give what
    ComfyUI's own LoRA loader computes: the weights plus strength x the LoRA's difference."""
    high, _ = pair
    experts = handle(high, None, loras=[use(lora_files, fmt, "high", 0.8)])
    before = forward(high)
    L.reconcile(experts)
    ours = forward(high)
    # The oracle merges the ComfyUI-format file (the musubi and diffusers files hold the same values).
    source = lora_files[("lightx2v" if fmt == "lightx2v" else "comfy", "high")]
    expected = forward(comfy_merge(fresh_pair()[0], source, 0.8))
    assert (ours - before).abs().max().item() > 1e-3
    assert (ours - expected).abs().max().item() <= 1e-5


def test_chained_loras_add_up(pair, lora_files):
    high, _ = pair
    second = L.read_lora(lora_files[("comfy", "low")], "high_noise_lora", torch.float32)
    L.reconcile(handle(high, None, loras=[use(lora_files, "comfy", "high", 0.5), L.LoraUse("high", second, -1.2)]))
    expected = comfy_merge(comfy_merge(fresh_pair()[0], lora_files[("comfy", "high")], 0.5),
                           lora_files[("comfy", "low")], -1.2)
    assert (forward(high) - forward(expected)).abs().max().item() <= 1e-5
    assert L.adapter_names(high) == ["wan22_lora_0", "wan22_lora_1"]


def test_strength_zero_is_bit_identical_to_no_lora(pair, lora_files):
    high, low = pair
    schedule = template_schedule(handle(high, low))
    plain, _ = D.denoise(handle(high, low), schedule, run_inputs(), 1.0, 1.0)
    zero = handle(high, low, loras=[use(lora_files, "comfy", "high", 0.0), use(lora_files, "comfy", "low", 0.0)])
    out, _ = D.denoise(zero, schedule, run_inputs(), 1.0, 1.0)
    assert torch.equal(out, plain)
    assert L.leftovers(high) == [] and L.leftovers(low) == []


def test_a_high_noise_lora_leaves_the_low_noise_expert_untouched(pair, lora_files):
    high, low = pair
    low_before, high_before = forward(low), forward(high)
    L.reconcile(handle(high, low, loras=[use(lora_files, "comfy", "high")]))
    assert torch.equal(forward(low), low_before)
    assert L.leftovers(low) == []
    assert not torch.equal(forward(high), high_before)
    # And over a whole run (2 high + 2 low steps): the same as a hand-merged high-noise expert next to
    # the plain low-noise one.
    experts = handle(high, low, loras=[use(lora_files, "comfy", "high")])
    ours, _ = D.denoise(experts, template_schedule(experts), run_inputs(), 1.0, 1.0)
    merged = handle(comfy_merge(fresh_pair()[0], lora_files[("comfy", "high")], 1.0), fresh_pair()[1])
    expected, _ = D.denoise(merged, template_schedule(merged), run_inputs(), 1.0, 1.0)
    assert (ours - expected).abs().max().item() <= 1e-5


def test_runs_reconcile_the_adapters_with_their_own_handle(pair, lora_files):
    """One pair of experts, handles with and without LoRAs in turn: each run is what its handle asks for,
    and a handle without LoRAs leaves no trace of PEFT on the experts."""
    high, low = pair
    lora = use(lora_files, "comfy", "high")
    with_lora = handle(high, low, loras=[lora, use(lora_files, "comfy", "low")])
    weaker = handle(high, low, loras=[L.LoraUse("high", lora.lora, 0.5)])
    plain = handle(high, low)
    schedule = template_schedule(plain)
    outs = [D.denoise(h, schedule, run_inputs(), 1.0, 1.0)[0] for h in (with_lora, plain, weaker, with_lora, plain)]
    assert torch.equal(outs[0], outs[3]) and torch.equal(outs[1], outs[4])
    assert not torch.equal(outs[0], outs[2]) and not torch.equal(outs[1], outs[2])
    assert L.leftovers(high) == [] and L.leftovers(low) == []
    fresh, _ = D.denoise(handle(*fresh_pair()), schedule, run_inputs(), 1.0, 1.0)
    assert torch.equal(outs[1], fresh)


def test_lora_with_cache_seeds_a_b_a_are_bit_identical():
    high, low = fresh_pair(num_layers=8)
    files = {}
    model = tiny_wan.make_expert("t2v", 0, num_layers=8)
    folder = os.environ.get("TMPDIR", "/tmp")
    for role, seed in (("high", 51), ("low", 52)):
        files[("comfy", role)] = tiny_wan.write_tiny_lora(model, os.path.join(folder, f"w22_cache_{role}.safetensors"),
                                                          seed=seed, amplitude=0.02)
    plan = C.CachePlan(high=C.ExpertCacheSettings(1, -1), low=C.ExpertCacheSettings(1, -1))
    experts = handle(high, low, loras=[use(files, "comfy", "high"), use(files, "comfy", "low")], plan=plan)
    schedule = S.build_schedule(sampler="unipc", steps=16, flow_shift=5.0, has_high=True, has_low=True,
                                model_default=0.875)
    try:
        a1, rec_a = D.denoise(experts, schedule, run_inputs(1), 4.0, 3.0)
        b, _ = D.denoise(experts, schedule, run_inputs(2), 4.0, 3.0)
        a2, _ = D.denoise(experts, schedule, run_inputs(1), 4.0, 3.0)
        assert torch.equal(a1, a2) and not torch.equal(a1, b)
        assert rec_a.cache["low"]["cached_steps"], "the cache must really serve steps in this test"
        assert L.adapter_names(high) == ["wan22_lora_0"] and C.is_cached(high)
    finally:
        for m in (high, low):
            L.remove(m)
            C.remove(m)


def test_the_report_says_the_cache_can_skip_nothing_at_four_steps(pair, lora_files):
    experts = handle(*pair, loras=[use(lora_files, "comfy", "high"), use(lora_files, "comfy", "low")],
                     plan=C.CachePlan())
    _, record = D.denoise(experts, template_schedule(experts), run_inputs(), 1.0, 1.0)
    for role in ("high", "low"):
        stats = record.cache[role]
        assert stats["skippable_steps"] == 0 and stats["cached_steps"] == []
        assert "can skip none" in stats["note"] and f"{role}_warmup_steps" in stats["note"]
    # 40 steps: the bound is the expert's steps less its warm-up, capped by max_cached_steps.
    assert C.skippable_steps(C.CachePlan(), "high", 17) == 13 and C.skippable_steps(C.CachePlan(), "low", 23) == 20


def test_adapters_compute_in_the_experts_dtype(pair, lora_files):
    high, low = pair
    high.to(torch.bfloat16)
    L.reconcile(handle(high, None, loras=[use(lora_files, "lightx2v", "high", dtype=torch.bfloat16)],
                       dtype=torch.bfloat16))
    dtypes = {p.dtype for n, p in high.named_parameters() if "lora_" in n}
    assert dtypes == {torch.bfloat16}


@pytest.mark.parametrize("bad,needle", [("wide", "does not fit these experts"), ("expert", "not a Wan LoRA"),
                                        ("truncated", "truncated")])
def test_a_lora_for_another_model_is_refused_by_name(pair, lora_files, bad, needle):
    high, _ = pair
    with pytest.raises(Wan22InputError) as e:
        lora = L.read_lora(lora_files[bad], "high_noise_lora", torch.float32)
        L.check_fits(lora, high, "high_noise_lora")
    assert e.value.input_name == "high_noise_lora"
    assert os.path.basename(lora_files[bad]) in str(e.value) and needle in str(e.value)


@pytest.mark.filterwarnings("ignore:Adapter wan22_lora_1 was active")
def test_a_failed_load_leaves_no_half_installed_adapters(pair, lora_files):
    high, low = pair
    good = use(lora_files, "comfy", "high")
    wide = L.LoraUse("high", L.read_lora(lora_files["wide"], "high_noise_lora", torch.float32), 1.0)
    with pytest.raises(Exception):
        L.reconcile(handle(high, low, loras=[good, wide]))  # the second adapter cannot load
    assert L.leftovers(high) == []
    plain, _ = D.denoise(handle(high, low), template_schedule(handle(high, low)), run_inputs(), 1.0, 1.0)
    fresh, _ = D.denoise(handle(*fresh_pair()), template_schedule(handle(high, low)), run_inputs(), 1.0, 1.0)
    assert torch.equal(plain, fresh)


def test_a_lora_on_fp8_experts_equals_it_on_the_dequantised_experts(tmp_path, lora_files):
    """fp8 experts keep fp8 weights (dequantised per layer): PEFT wraps those layers, its adapters compute
    in bf16, and the result is bit-identical to the same LoRA on the experts dequantised at load time."""
    from wan22_cachedit.nodes.core import experts as E
    from wan22_cachedit.nodes.core.fp8 import Fp8ScaledLinear

    path = tiny_wan.write_single_file(tiny_wan.make_expert("t2v", 5), str(tmp_path / "fp8.safetensors"), "fp8_scaled")
    fp8 = E.load_single_file_experts(path, None)
    plain = E.load_single_file_experts(path, None)
    for name, layer in list(plain.high_noise.named_modules()):
        if isinstance(layer, Fp8ScaledLinear):
            parent, _, child = name.rpartition(".")
            dense = torch.nn.Linear(layer.in_features, layer.out_features, dtype=torch.bfloat16)
            dense.weight.data, dense.bias = layer.dequantized_weight(), layer.bias
            setattr(plain.high_noise.get_submodule(parent), child, dense)
    assert fp8.dtype == torch.bfloat16
    outs = []
    for experts in (fp8, plain):
        lora = L.read_lora(lora_files[("lightx2v", "high")], "high_noise_lora", experts.dtype)
        L.reconcile(experts.replace(loras=(L.LoraUse("high", lora, 1.0),)))
        assert {p.dtype for n, p in experts.high_noise.named_parameters() if "lora_" in n} == {torch.bfloat16}
        g = torch.Generator().manual_seed(0)
        x, e = torch.randn(SHAPE, generator=g), torch.randn(1, 24, 4096, generator=g)
        with torch.no_grad():
            outs.append(experts.high_noise(hidden_states=x.to(torch.bfloat16), timestep=torch.tensor([700.0]),
                                           encoder_hidden_states=e.to(torch.bfloat16), return_dict=False)[0])
    wrapped = fp8.high_noise.blocks[0].attn1.to_q
    assert isinstance(wrapped.base_layer, Fp8ScaledLinear) and wrapped.base_layer.weight.dtype == torch.float8_e4m3fn
    assert torch.equal(outs[0], outs[1])


def test_tensors_the_conversion_does_not_apply_are_named(tmp_path, lora_files):
    """LightX2V's zero norm differences are dropped silently (they change nothing); a non-zero tensor that
    diffusers' conversion leaves out (here a modulation difference) is named, and the rest still applies."""
    from safetensors.torch import save_file

    assert L.read_lora(lora_files[("lightx2v", "high")], "high_noise_lora", torch.float32).left_out == ()
    tensors = tiny_wan.lora_tensors(tiny_wan.make_expert("t2v", 0), "lightx2v")
    tensors["diffusion_model.blocks.1.diff_m"] = torch.ones(1, 6, 128, dtype=torch.bfloat16)
    path = str(tmp_path / "with_modulation.safetensors")
    save_file(tensors, path)
    lora = L.read_lora(path, "high_noise_lora", torch.float32)
    assert lora.left_out == ("blocks.1.diff_m",)
    assert lora.layers == 4 * len(tiny_wan.LORA_LAYERS) + 1  # every linear, and the head


def test_a_peft_file_with_its_own_alpha_loads_as_diffusers_loads_it(pair, tmp_path):
    """diffusers/PEFT files saved with their LoRA config (here lora_alpha = 4 x rank): the config decides the
    scaling, as in diffusers' own loading; without it the same weights would act 4 times weaker."""
    from diffusers.loaders.lora_pipeline import WanLoraLoaderMixin
    from safetensors import safe_open

    source = tiny_wan.write_tiny_lora(tiny_wan.make_expert("t2v", 0), str(tmp_path / "d.safetensors"), "diffusers")
    with safe_open(source, framework="pt") as f:
        layers = {k[len("transformer."):]: f.get_tensor(k) for k in f.keys()}
    config = {"r": 4, "lora_alpha": 16, "target_modules": sorted({k.rpartition(".lora_")[0] for k in layers})}
    WanLoraLoaderMixin.save_lora_weights(str(tmp_path), transformer_lora_layers=layers,
                                         transformer_lora_adapter_metadata=config, weight_name="peft.safetensors")
    path = str(tmp_path / "peft.safetensors")
    lora = L.read_lora(path, "high_noise_lora", torch.float32)
    assert lora.metadata["lora_alpha"] == 16
    high, _ = pair
    L.reconcile(handle(high, None, loras=[L.LoraUse("high", lora, 1.0)]))
    reference = fresh_pair()[0]
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=reference)
    pipe.load_lora_weights(path, adapter_name="d")
    assert (forward(high) - forward(reference)).abs().max().item() <= 1e-5
    assert high.blocks[0].attn1.to_q.scaling == {"wan22_lora_0": 4.0}
