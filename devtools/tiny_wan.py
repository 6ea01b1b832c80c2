"""Tiny randomly-initialised Wan2.2 experts, written in the real file formats.

Nothing can be downloaded here, so tests and the demo build experts of the real architecture at a
tiny size (head width 128 like the real ones, so the config can be read off the tensors) and write
them as ComfyUI single files and diffusers folders, which the pack then loads through the real loaders.
"""

from __future__ import annotations

import json
import os

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from .paths import import_pack

import_pack()
from wan22_cachedit.nodes.core.checkpoint import GGUF_SHAPE_KEY  # noqa: E402
from wan22_cachedit.nodes.core.diffusers_folder import to_comfy_layout  # noqa: E402

PREFIX = "model.diffusion_model."
IN_CHANNELS = {"t2v": 16, "i2v": 36, "fun_control": 52, "ti2v": 48}
SINGLE_FILE_FORMATS = ("fp32", "fp16", "bf16", "fp8_scaled", "fp8_comfy_quant")
FP8_MAX = 448.0  # largest float8_e4m3fn


def tiny_config(task: str = "t2v", num_layers: int = 4, dim: int = 128, ffn_dim: int = 256,
                text_dim: int = 4096) -> dict:
    """`task`: t2v or i2v (the A14B experts), or ti2v (the 5B model: 48 channels in and out)."""
    return {"patch_size": [1, 2, 2], "num_attention_heads": dim // 128, "attention_head_dim": 128,
            "in_channels": IN_CHANNELS[task], "out_channels": 48 if task == "ti2v" else 16, "text_dim": text_dim,
            "freq_dim": 256,
            "ffn_dim": ffn_dim, "num_layers": num_layers, "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None, "added_kv_proj_dim": None,
            "rope_max_seq_len": 1024}


def make_expert(task: str = "t2v", seed: int = 0, **config) -> WanTransformer3DModel:
    """A randomly-initialised fp32 expert; the same seed gives the same weights."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**tiny_config(task, **config))
    with torch.no_grad():  # the default init leaves the modulation tables tiny; make every path matter
        for name, p in model.named_parameters():
            if "scale_shift_table" in name:
                p.normal_(0.0, 0.1)
    return model.eval().requires_grad_(False)


def to_original_layout(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers names -> the original Wan names of ComfyUI's files, by the pack's own rename (which a core
    test checks against diffusers' conversion the other way)."""
    return to_comfy_layout(state_dict)


def _is_quantised(name: str) -> bool:
    """Which weights ComfyUI's fp8 files store in fp8: the linear layers inside the blocks."""
    return name.startswith("blocks.") and name.endswith((
        ".self_attn.q.weight", ".self_attn.k.weight", ".self_attn.v.weight", ".self_attn.o.weight",
        ".cross_attn.q.weight", ".cross_attn.k.weight", ".cross_attn.v.weight", ".cross_attn.o.weight",
        ".ffn.0.weight", ".ffn.2.weight"))


def _fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = weight.abs().max().clamp(min=1e-12).float() / FP8_MAX
    return (weight.float() / scale).to(torch.float8_e4m3fn), scale.reshape(())


def single_file_tensors(model: WanTransformer3DModel, fmt: str) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) as ComfyUI's repackaged Wan2.2 files hold them."""
    original = to_original_layout({k: v.detach().clone() for k, v in model.state_dict().items()})
    metadata = {"format": "pt"}
    if fmt in ("fp32", "fp16", "bf16"):
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[fmt]
        return {PREFIX + k: v.to(dtype).contiguous() for k, v in original.items()}, metadata
    if fmt not in SINGLE_FILE_FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    tensors = {}
    for name, value in original.items():
        if not _is_quantised(name):
            tensors[PREFIX + name] = value.to(torch.bfloat16).contiguous()
            continue
        layer = PREFIX + name[: -len(".weight")]
        q, scale = _fp8(value)
        tensors[layer + ".weight"] = q
        if fmt == "fp8_scaled":  # older format: a marker tensor + per-layer scale_weight / scale_input
            tensors[layer + ".scale_weight"] = scale
            tensors[layer + ".scale_input"] = torch.tensor(1.0)
        else:  # newer format: per-layer comfy_quant JSON + weight_scale
            conf = json.dumps({"format": "float8_e4m3fn"}).encode()
            tensors[layer + ".comfy_quant"] = torch.tensor(list(conf), dtype=torch.uint8)
            tensors[layer + ".weight_scale"] = scale
    if fmt == "fp8_scaled":
        tensors[PREFIX + "scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return tensors, metadata


def write_single_file(model: WanTransformer3DModel, path: str, fmt: str = "fp16") -> str:
    tensors, metadata = single_file_tensors(model, fmt)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path, metadata=metadata)
    return path


# --- the other Wan2.2 A14B variants, in ComfyUI's own layout: Fun-Control (52 channels in, a reference image
# embedding), Fun-Camera (an image-to-video model with a camera adapter) and VACE (VACE blocks beside the main
# ones). Fun-InP has the image-to-video layout (36 channels).

VACE_CHANNELS, VACE_BLOCKS = 96, 2  # VACE's control channels (16 frames + 16 reactive frames + 64 mask), its blocks
CAMERA_CHANNELS = 24  # the camera embedding's channels per pixel (WanCameraEmbedding: Plücker rays), ComfyUI's default

def random_half(g: torch.Generator, shape) -> torch.Tensor:
    """Small random fp16 weights (N(0, 0.05)) for the parts a variant adds to a tiny model."""
    return (torch.randn(*shape, generator=g) * 0.05).to(torch.float16)


def variant_tensors(model: WanTransformer3DModel, variant: str, seed: int = 51) -> dict[str, torch.Tensor]:
    """fp16 single-file tensors of `model` with what the variant adds, random: `fun_control` (a 52-channel
    model) gets `ref_conv` (the reference latent's 16 channels to the width, on 2x2 patches), `fun_camera` (a
    36-channel model) gets `control_adapter` (the camera embedding, unshuffled by 8, to the width on 2x2 patches,
    and one residual block of two 3x3 convolutions), `vace` gets a VACE patch embedding (96 channels: VACE frames
    and masks) and two VACE blocks (each a perturbed copy of a main block with its projections: before_proj on the
    first only), which a 4-layer model adds after blocks 0 and 2."""
    tensors, _ = single_file_tensors(model, "fp16")
    dim = model.config.num_attention_heads * model.config.attention_head_dim
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return random_half(g, shape)

    if variant == "fun_control":
        tensors[PREFIX + "ref_conv.weight"], tensors[PREFIX + "ref_conv.bias"] = rand(dim, 16, 2, 2), rand(dim)
    elif variant == "fun_camera":
        adapter = PREFIX + "control_adapter."
        tensors[adapter + "conv.weight"] = rand(dim, CAMERA_CHANNELS * 64, 2, 2)
        tensors[adapter + "conv.bias"] = rand(dim)
        for conv in ("conv1", "conv2"):
            tensors[f"{adapter}residual_blocks.0.{conv}.weight"] = rand(dim, dim, 3, 3)
            tensors[f"{adapter}residual_blocks.0.{conv}.bias"] = rand(dim)
    elif variant == "vace":
        tensors[PREFIX + "vace_patch_embedding.weight"] = rand(dim, VACE_CHANNELS, 1, 2, 2)
        tensors[PREFIX + "vace_patch_embedding.bias"] = rand(dim)
        for k in range(VACE_BLOCKS):  # ComfyUI maps VACE block k after main block k * (layers // VACE_BLOCKS)
            for name in [n for n in tensors if n.startswith(f"{PREFIX}blocks.{k}.")]:
                tensors[name.replace(f"blocks.{k}.", f"vace_blocks.{k}.")] = tensors[name] + rand(*tensors[name].shape)
            for proj in ("before_proj", "after_proj") if k == 0 else ("after_proj",):
                tensors[f"{PREFIX}vace_blocks.{k}.{proj}.weight"] = rand(dim, dim)
                tensors[f"{PREFIX}vace_blocks.{k}.{proj}.bias"] = rand(dim)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return tensors


def write_variant(model: WanTransformer3DModel, path: str, variant: str, dtype: torch.dtype = torch.float16) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tensors = {name: t.to(dtype) for name, t in variant_tensors(model, variant).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return path


# Wan2.2 models whose forward adds work between the blocks, built by ComfyUI's own classes (their extra modules
# are many and intricate): kind -> (module, class, its tiny arguments). S2V keeps its default audio layers
# (injectors for blocks beyond the tiny depth are built and never run); Animate adds a face adapter every 5 blocks.
COMFY_VARIANTS = {
    "s2v": ("comfy.ldm.wan.model", "WanModel_S2V", dict(dim=128, ffn_dim=256, num_heads=1, num_layers=4)),
    "animate": ("comfy.ldm.wan.model_animate", "AnimateWanModel",
                dict(dim=128, ffn_dim=256, num_heads=1, num_layers=5, in_dim=36, image_model="wan2.1")),
}


def write_comfy_variant(path: str, kind: str, seed: int = 61) -> str:
    """A tiny `kind` (COMFY_VARIANTS) transformer from ComfyUI's own class, random fp16 weights, in the single-file
    layout Load Diffusion Model detects as that model. Only where ComfyUI is imported (its process)."""
    import importlib

    import comfy.ops

    module, name, arguments = COMFY_VARIANTS[kind]
    model = getattr(importlib.import_module(module), name)(operations=comfy.ops.disable_weight_init, **arguments)
    g = torch.Generator().manual_seed(seed)
    tensors = {PREFIX + key: random_half(g, value.shape) for key, value in model.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


# --- GGUF, as ComfyUI-GGUF's UnetLoaderGGUF reads it (the `gguf` package writes and quantizes) ---

GGUF_TYPES = ("Q8_0", "Q5_1", "F16")  # quant types the `gguf` package quantizes in numpy, and plain half


def write_gguf(model: WanTransformer3DModel, path: str, qtype: str = "Q8_0") -> str:
    """A GGUF file of `model` in the original Wan layout (architecture "wan"), as ComfyUI-GGUF's own converter
    and llama.cpp's quantizer lay it out: the block and embedding matrices in `qtype`, the modulation tables,
    1-D and small tensors in F32; the 5-D patch embedding flattened to 2-D, F32, its shape kept under
    `comfy.gguf.orig_shape.<name>` (GGUF itself stores at most four dimensions)."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    writer = gguf.GGUFWriter(path=None, arch="wan")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))
    for name, value in to_original_layout({k: v.detach() for k, v in model.state_dict().items()}).items():
        array = value.to(torch.float32).numpy()
        small = array.ndim != 2 or array.size <= 1024 or ".modulation" in name or array.shape[-1] % block
        dtype = gguf.GGMLQuantizationType.F32 if small else kind
        if array.ndim > 4:
            writer.add_array(GGUF_SHAPE_KEY + name, [int(d) for d in array.shape])
            array = array.reshape(array.shape[0], -1)
        writer.add_tensor(name, gguf.quants.quantize(array, dtype), raw_dtype=dtype)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return path


def write_diffusers_folder(path: str, high: WanTransformer3DModel | None, low: WanTransformer3DModel | None,
                           boundary_ratio: float | None = 0.875) -> str:
    """A diffusers Wan2.2 folder: model_index.json, transformer/ (high noise), transformer_2/ (low noise)."""
    os.makedirs(path, exist_ok=True)
    index = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": [None, None],
             "tokenizer": [None, None], "vae": [None, None],
             "transformer": ["diffusers", "WanTransformer3DModel"] if high is not None else [None, None],
             "transformer_2": ["diffusers", "WanTransformer3DModel"] if low is not None else [None, None]}
    if boundary_ratio is not None:
        index["boundary_ratio"] = boundary_ratio
    with open(os.path.join(path, "model_index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    for sub, model in (("transformer", high), ("transformer_2", low)):
        if model is not None:
            model.save_pretrained(os.path.join(path, sub), safe_serialization=True)
    return path


# --- tiny LoRAs in the formats people have: ComfyUI/kohya, LightX2V, diffusers/PEFT ---

LORA_FORMATS = ("comfy", "lightx2v", "musubi", "diffusers")
LORA_LAYERS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
LORA_NAMES = {"high": "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
              "low": "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"}


def lora_tensors(model: WanTransformer3DModel, fmt: str = "comfy", rank: int = 4, alpha: float = 2.0,
                 seed: int = 11, amplitude: float = 0.05) -> dict[str, torch.Tensor]:
    """A random LoRA over every block linear layer of `model` (original Wan names), as a file holds it.

    comfy: `diffusion_model.<layer>.lora_down/lora_up.weight` + `.alpha` (ComfyUI/kohya), fp16.
    lightx2v: the same in bf16, plus the bias differences (`diff_b`), zeroed norm differences and a full
    head difference (`head.head.diff`/`diff_b`) that LightX2V's distillation LoRAs carry.
    musubi: musubi-tuner's `lora_unet_blocks_0_self_attn_q.lora_down.weight` + `.alpha`, fp16.
    diffusers: PEFT names under `transformer.` (`lora_A`/`lora_B`, alpha folded into the weights)."""
    if fmt not in LORA_FORMATS:
        raise ValueError(f"unknown LoRA format {fmt!r}")
    g = torch.Generator().manual_seed(seed)
    shapes = {k: tuple(v.shape) for k, v in to_original_layout(model.state_dict()).items()}
    blocks = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("blocks.")})
    tensors = {}
    for i in blocks:
        for layer in LORA_LAYERS:
            name = f"blocks.{i}.{layer}"
            out_f, in_f = shapes[name + ".weight"]
            down = torch.randn(rank, in_f, generator=g) * amplitude
            up = torch.randn(out_f, rank, generator=g) * amplitude
            tensors[f"diffusion_model.{name}.lora_down.weight"] = down
            tensors[f"diffusion_model.{name}.lora_up.weight"] = up
            tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(float(alpha))
            if fmt == "lightx2v":
                tensors[f"diffusion_model.{name}.diff_b"] = torch.randn(out_f, generator=g) * amplitude
        if fmt == "lightx2v":
            tensors[f"diffusion_model.blocks.{i}.norm3.diff"] = torch.zeros(shapes[f"blocks.{i}.norm3.weight"])
            tensors[f"diffusion_model.blocks.{i}.norm3.diff_b"] = torch.zeros(shapes[f"blocks.{i}.norm3.bias"])
    if fmt == "lightx2v":
        tensors["diffusion_model.head.head.diff"] = torch.randn(shapes["head.head.weight"], generator=g) * amplitude
        tensors["diffusion_model.head.head.diff_b"] = torch.randn(shapes["head.head.bias"], generator=g) * amplitude
        return {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    if fmt == "comfy":
        return {k: v.to(torch.float16).contiguous() for k, v in tensors.items()}
    if fmt == "musubi":
        def musubi(key):  # diffusion_model.blocks.0.self_attn.q.alpha -> lora_unet_blocks_0_self_attn_q.alpha
            name = key[len("diffusion_model."):]
            suffix = next(s for s in (".lora_down.weight", ".lora_up.weight", ".alpha") if name.endswith(s))
            return "lora_unet_" + name[: -len(suffix)].replace(".", "_") + suffix
        return {musubi(k): v.to(torch.float16).contiguous() for k, v in tensors.items()}
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers

    return {k: v.contiguous() for k, v in _convert_non_diffusers_wan_lora_to_diffusers(tensors).items()}


def write_tiny_lora(model: WanTransformer3DModel, path: str, fmt: str = "comfy", **kwargs) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(lora_tensors(model, fmt, **kwargs), path, metadata={"format": "pt"})
    return path


# File names as ComfyUI's repackaged Wan2.2 files are named.
REPACKAGED_NAMES = {
    ("t2v", "high"): "wan2.2_t2v_high_noise_14B_{fmt}.safetensors",
    ("t2v", "low"): "wan2.2_t2v_low_noise_14B_{fmt}.safetensors",
    ("i2v", "high"): "wan2.2_i2v_high_noise_14B_{fmt}.safetensors",
    ("i2v", "low"): "wan2.2_i2v_low_noise_14B_{fmt}.safetensors",
}
EXPERT_SEEDS = {("t2v", "high"): 1, ("t2v", "low"): 2, ("i2v", "high"): 3, ("i2v", "low"): 4}


def write_tiny_models(models_dir: str, formats=("fp16",), tasks=("t2v",), diffusers_folders=True,
                      text_encoder=True, **config) -> dict:
    """Writes tiny experts under a ComfyUI models folder; returns {(task, role, fmt): file name} and the
    fp32 models they were written from, keyed by (task, role). The diffusers folders also carry a tiny
    umt5 text encoder and tokenizer."""
    names, models = {}, {}
    for task in tasks:
        for role in ("high", "low"):
            model = make_expert(task, EXPERT_SEEDS[(task, role)], **config)
            models[(task, role)] = model
            for fmt in formats:
                name = REPACKAGED_NAMES[(task, role)].format(fmt=fmt)
                write_single_file(model, os.path.join(models_dir, "diffusion_models", name), fmt)
                names[(task, role, fmt)] = name
        if diffusers_folders:
            folder = f"Wan2.2-{task.upper()}-A14B-tiny-Diffusers"
            path = os.path.join(models_dir, "diffusers", folder)
            write_diffusers_folder(path, models[(task, "high")], models[(task, "low")],
                                   boundary_ratio={"t2v": 0.875, "i2v": 0.9}[task])
            if text_encoder:
                write_tiny_text_encoder(path)
            names[(task, "diffusers")] = folder
    return {"names": names, "models": models}


# --- tiny stand-ins for the parts around the experts: the umt5 text encoder and the Wan 2.1 VAE ---

TINY_WORDS = ("a cat a dog the of in on with and walks runs sits jumps slowly quickly red blue green small big "
              "city street forest beach sunset night rain snow camera pans zooms close up wide shot video of "
              "blurry low quality static worst overexposed text watermark").split()


def write_tiny_text_encoder(folder: str, d_model: int = 4096, seed: int = 21) -> str:
    """A tiny umt5 encoder (transformers, safetensors) and a word-level tokenizer built in code, under
    folder/text_encoder and folder/tokenizer, as a diffusers Wan2.2 folder holds them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in TINY_WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=512)
    fast.save_pretrained(os.path.join(folder, "tokenizer"))
    torch.manual_seed(seed)
    config = UMT5Config(vocab_size=64, d_model=d_model, d_kv=32, d_ff=64, num_layers=1, num_heads=2,
                        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0,
                        eos_token_id=1, decoder_start_token_id=0)
    UMT5EncoderModel(config).eval().save_pretrained(os.path.join(folder, "text_encoder"), safe_serialization=True)
    return folder


def write_tiny_wan_vae(path: str, seed: int = 31) -> str:
    """A tiny Wan 2.1 VAE built from ComfyUI's own class, so ComfyUI's native VAELoader reads it (its width
    comes from decoder.head.0.gamma). Needs ComfyUI importable (the caller puts it on sys.path)."""
    from comfy.ldm.wan.vae import WanVAE

    torch.manual_seed(seed)
    vae = WanVAE(dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                 temperal_downsample=[False, True, True], dropout=0.0)
    with torch.no_grad():  # ComfyUI's ops skip weight init: give every tensor a real value
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                fan_in = p[0].numel() if p.dim() > 1 else 1
                p.normal_(0.0, fan_in ** -0.5)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, path, metadata={"format": "pt"})
    return path


def write_tiny_flux(path: str, seed: int = 41) -> str:
    """A tiny Flux transformer from ComfyUI's own class (width 128, one block of each kind), which ComfyUI's
    Load Diffusion Model reads as a Flux MODEL: a model that is not Wan. Needs ComfyUI importable."""
    import comfy.ops
    from comfy.ldm.flux.model import Flux

    torch.manual_seed(seed)
    flux = Flux(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=64, context_in_dim=64,
                hidden_size=128, mlp_ratio=4.0, num_heads=1, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
                theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False, txt_ids_dims=[],
                operations=comfy.ops.disable_weight_init)
    with torch.no_grad():  # ComfyUI's ops skip weight init
        for p in flux.parameters():
            p.normal_(0.0, 0.02)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file({PREFIX + k: v.contiguous() for k, v in flux.state_dict().items()}, path, metadata={"format": "pt"})
    return path
