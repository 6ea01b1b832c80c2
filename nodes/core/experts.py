"""The WAN22_EXPERTS handle: the two Wan2.2 A14B experts (either may be missing), loaded and checked.

The architecture is read off the tensors the way ComfyUI does it (the files store no head count),
never guessed from a file name. Single files go through diffusers' own single-file conversion with a
local config; diffusers folders through `from_pretrained`. Neither touches the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import WanTransformer3DModel

from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

from . import checkpoint
from .errors import Wan22InputError
from .fp8 import install_fp8_layers
from .logs import quiet_diffusers_dtype_warning
from .schedule import DEFAULT_BOUNDARY

HEAD_DIM = 128  # Wan's attention head width: ComfyUI derives num_heads = dim // 128 the same way
TASKS = {16: "t2v", 36: "i2v"}  # in-channels: 16 noise; I2V adds 4 mask + 16 image channels
WAN_TOP_LEVEL = {"patch_embedding", "text_embedding", "time_embedding", "time_projection", "blocks", "head"}
REQUIRED_TENSORS = ("patch_embedding.weight", "head.modulation", "head.head.weight", "blocks.0.ffn.0.weight",
                    "text_embedding.0.weight", "time_embedding.0.weight")

WEIGHT_DTYPES = {"default": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EXPERT_INPUTS = {"high_noise": "high_noise_model", "low_noise": "low_noise_model"}


@dataclass(frozen=True)
class WanExpertConfig:
    """The architecture of one Wan2.2 expert, as read off its tensors."""

    dim: int
    num_heads: int
    ffn_dim: int
    num_layers: int
    in_channels: int
    out_channels: int
    text_dim: int
    freq_dim: int
    patch_size: tuple[int, int, int] = (1, 2, 2)

    @property
    def task(self) -> str:
        return TASKS[self.in_channels]

    def diffusers_config(self) -> dict[str, Any]:
        return {
            "_class_name": "WanTransformer3DModel", "patch_size": list(self.patch_size),
            "num_attention_heads": self.num_heads, "attention_head_dim": self.dim // self.num_heads,
            "in_channels": self.in_channels, "out_channels": self.out_channels, "text_dim": self.text_dim,
            "freq_dim": self.freq_dim, "ffn_dim": self.ffn_dim, "num_layers": self.num_layers,
            "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
            "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
        }

    @classmethod
    def from_diffusers_config(cls, config: dict) -> "WanExpertConfig":
        return cls(dim=config["num_attention_heads"] * config["attention_head_dim"],
                   num_heads=config["num_attention_heads"], ffn_dim=config["ffn_dim"],
                   num_layers=config["num_layers"], in_channels=config["in_channels"],
                   out_channels=config.get("out_channels") or config["in_channels"], text_dim=config["text_dim"],
                   freq_dim=config["freq_dim"], patch_size=tuple(config.get("patch_size", (1, 2, 2))))


def config_from_shapes(shapes: dict[str, list[int]], input_name: str, file_name: str) -> WanExpertConfig:
    """Reads the architecture off tensor shapes (original Wan layout, prefix stripped)."""
    def not_wan(why: str) -> Wan22InputError:
        return Wan22InputError(input_name, f"{file_name} is not a Wan2.2 A14B transformer ({why}); pick a Wan2.2 "
                                           "high-noise or low-noise diffusion model file")

    missing = [k for k in REQUIRED_TENSORS if k not in shapes]
    if missing:
        return_msg = f"missing tensor {missing[0]}" if len(shapes) else "no tensors"
        raise not_wan(return_msg)
    extra = sorted({name.split(".")[0] for name in shapes} - WAN_TOP_LEVEL - {"scaled_fp8"})
    if extra:
        raise not_wan(f"unexpected tensors {', '.join(x + '.*' for x in extra[:4])}: Wan2.1 image or VACE/"
                      "animate variants are not Wan2.2 A14B experts")
    patch = shapes["patch_embedding.weight"]  # [dim, in_channels, 1, 2, 2]
    dim = shapes["head.modulation"][-1]
    if len(patch) != 5 or patch[0] != dim or dim % HEAD_DIM:
        raise not_wan(f"patch embedding {patch} does not fit a Wan transformer of width {dim}")
    in_channels = patch[1]
    if in_channels not in TASKS:
        raise not_wan(f"{in_channels} input channels; Wan2.2 A14B experts have 16 (text-to-video) or 36 "
                      "(image-to-video), the 5B model has 48 and is a single transformer")
    patch_size = tuple(patch[2:])
    out_channels = shapes["head.head.weight"][0] // (patch_size[0] * patch_size[1] * patch_size[2])
    layers = {int(m.group(1)) for name in shapes if (m := re.match(r"blocks\.(\d+)\.", name))}
    return WanExpertConfig(dim=dim, num_heads=dim // HEAD_DIM, ffn_dim=shapes["blocks.0.ffn.0.weight"][0],
                           num_layers=max(layers) + 1, in_channels=in_channels, out_channels=out_channels,
                           text_dim=shapes["text_embedding.0.weight"][1],
                           freq_dim=shapes["time_embedding.0.weight"][1], patch_size=patch_size)


@dataclass(frozen=True, eq=False)
class Wan22Experts:
    """The WAN22_EXPERTS handle. A value: nodes return new handles (`dataclasses.replace`), never mutate one.

    The modules themselves are shared between handles; what is installed on them (cache hooks,
    adapters) is reconciled by the sampler with the handle of the run in front of it.
    """

    high_noise: torch.nn.Module | None = dataclasses.field(repr=False)
    low_noise: torch.nn.Module | None = dataclasses.field(repr=False)
    config: WanExpertConfig
    dtype: torch.dtype
    sources: tuple[str, str]  # (high, low) names as chosen on the loader, "none" when missing
    default_boundary: float
    cache_plan: Any = None
    loras: tuple = ()  # LoraUse entries, applied in order on top of each other

    @property
    def has_high(self) -> bool:
        return self.high_noise is not None

    @property
    def has_low(self) -> bool:
        return self.low_noise is not None

    @property
    def task(self) -> str:
        return self.config.task

    def replace(self, **changes) -> "Wan22Experts":
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        loaded = [name for name, present in (("high", self.has_high), ("low", self.has_low)) if present]
        c = self.config
        return (f"Wan2.2 {self.task.upper()} experts: {' + '.join(loaded)} "
                f"(width {c.dim}, {c.num_layers} layers, {c.in_channels} in-channels, {str(self.dtype)[6:]})"
                + "".join(f"; {u.role} LoRA {u.lora.name} x{u.strength:g}" for u in self.loras))


def default_boundary(config: WanExpertConfig, declared: float | None = None) -> float:
    """The model's own boundary: what a diffusers folder declares, else the official one for the task."""
    return declared if declared is not None else DEFAULT_BOUNDARY[config.task]


def require_some_expert(high_name: str, low_name: str) -> None:
    if high_name == "none" and low_name == "none":
        raise Wan22InputError("high_noise_model", "low_noise_model and high_noise_model are both 'none': "
                                                  "load at least one expert")


def check_matching(configs: dict[str, WanExpertConfig], names: dict[str, str]) -> None:
    """Two experts must have the same architecture; the error says which dimension differs."""
    if len(configs) < 2:
        return
    high, low = configs["high_noise"], configs["low_noise"]
    for field, label in (("in_channels", "in-channels"), ("dim", "width"), ("num_layers", "depth (layers)"),
                         ("ffn_dim", "feed-forward width"), ("text_dim", "text width"),
                         ("out_channels", "out-channels")):
        a, b = getattr(high, field), getattr(low, field)
        if a != b:
            hint = " (one is text-to-video, the other image-to-video)" if field == "in_channels" else ""
            raise Wan22InputError("low_noise_model", f"the experts do not match: {label} {a} in {names['high_noise']} "
                                                     f"vs {b} in {names['low_noise']}{hint}; load the high-noise "
                                                     "and low-noise files of the same Wan2.2 model")


def inspect_single_file(path: str, input_name: str) -> WanExpertConfig:
    """Header-only check of one expert file (cheap enough for prompt validation)."""
    name = os.path.basename(path)
    try:
        header, _ = checkpoint.read_header(path)
    except checkpoint.CheckpointFileError as e:
        raise Wan22InputError(input_name, f"{e}; download the file again or pick another one") from None
    prefix = checkpoint.key_prefix(header)
    shapes = {k[len(prefix):]: v["shape"] for k, v in header.items() if k.startswith(prefix)}
    return config_from_shapes(shapes, input_name, name)


def inspect_single_files(paths: dict[str, str | None]) -> dict[str, WanExpertConfig]:
    """Checks the chosen files (role -> path or None) and that they match one another."""
    configs = {role: inspect_single_file(path, EXPERT_INPUTS[role]) for role, path in paths.items() if path}
    check_matching(configs, {role: os.path.basename(p) for role, p in paths.items() if p})
    return configs


def _resolve_dtype(weight_dtype: str, stored: torch.dtype | None) -> torch.dtype:
    if weight_dtype not in WEIGHT_DTYPES:
        raise Wan22InputError("weight_dtype", f"unknown dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPES)}")
    chosen = WEIGHT_DTYPES[weight_dtype]
    if chosen is not None:
        return chosen
    if stored in (torch.float32, torch.float16, torch.bfloat16):
        return stored
    return torch.bfloat16  # fp8 files compute in bf16 unless told otherwise


def load_single_file_expert(path: str, config: WanExpertConfig, dtype: torch.dtype, input_name: str):
    """One expert through diffusers' single-file loader, with a local config (never the Hub).

    fp8 layers stay in fp8 (their weights pass diffusers' loader as meta tensors, then the layers are
    swapped for ones that dequantise on each call), so an fp8 file costs its own size in memory."""
    fp8_layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        state_dict = checkpoint.load_state_dict(path, dtype, fp8_out=fp8_layers)
    except checkpoint.CheckpointFileError as e:
        raise Wan22InputError(input_name, f"{e}") from None
    with tempfile.TemporaryDirectory(prefix="wan22-config-") as config_dir:
        with open(os.path.join(config_dir, "config.json"), "w") as f:
            json.dump(config.diffusers_config(), f)
        with quiet_diffusers_dtype_warning():
            model = WanTransformer3DModel.from_single_file(state_dict, config=config_dir, torch_dtype=dtype,
                                                           local_files_only=True)
    if fp8_layers:
        # The names diffusers' own conversion gives the fp8 weights (a dict of names converts like weights).
        renamed = convert_wan_transformer_to_diffusers({name: name for name in fp8_layers})
        install_fp8_layers(model, {new[: -len(".weight")]: fp8_layers[old] for new, old in renamed.items()}, dtype)
    unloaded = [n for n, p in model.named_parameters() if p.is_meta]
    if unloaded:
        raise Wan22InputError(input_name, f"{os.path.basename(path)} lacks weights for {unloaded[0]} (and "
                                          f"{len(unloaded) - 1} more): the file is incomplete; download it again")
    return model.eval().requires_grad_(False)


def load_single_file_experts(high_path: str | None, low_path: str | None, weight_dtype: str = "default",
                             names: tuple[str, str] | None = None, on_loaded=None) -> Wan22Experts:
    """The experts from ComfyUI-style single files (either path may be None); `on_loaded()` after each."""
    names = names or tuple(os.path.basename(p) if p else "none" for p in (high_path, low_path))
    require_some_expert(*names)
    paths = {"high_noise": high_path, "low_noise": low_path}
    configs = inspect_single_files(paths)
    config = next(iter(configs.values()))
    stored = checkpoint.stored_float_dtype(checkpoint.read_header(high_path or low_path)[0])
    dtype = _resolve_dtype(weight_dtype, stored)
    models = {}
    for role, path in paths.items():
        models[role] = load_single_file_expert(path, configs[role], dtype, EXPERT_INPUTS[role]) if path else None
        if path and on_loaded:
            on_loaded()
    return Wan22Experts(high_noise=models["high_noise"], low_noise=models["low_noise"], config=config, dtype=dtype,
                        sources=names, default_boundary=default_boundary(config))


# --- diffusers folders: model_index.json, transformer/ (high noise), transformer_2/ (low noise) ---

DIFFUSERS_SUBFOLDERS = {"high_noise": "transformer", "low_noise": "transformer_2"}
DIFFUSERS_CHOICES = {"both": ("high_noise", "low_noise"), "high_noise_only": ("high_noise",),
                     "low_noise_only": ("low_noise",)}


def _diffusers_weight_files(sub: str) -> list[str]:
    index = os.path.join(sub, "diffusion_pytorch_model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return sorted({os.path.join(sub, v) for v in json.load(f)["weight_map"].values()})
    return [os.path.join(sub, "diffusion_pytorch_model.safetensors")]


def inspect_diffusers_folder(folder: str, experts: str) -> tuple[dict[str, WanExpertConfig], float | None]:
    """Checks a diffusers Wan2.2 folder for the requested experts; returns their configs and the boundary
    that the folder's model_index.json declares (None when it declares none)."""
    name = os.path.basename(os.path.normpath(folder))
    if experts not in DIFFUSERS_CHOICES:
        raise Wan22InputError("experts", f"unknown choice {experts!r}: use one of {', '.join(DIFFUSERS_CHOICES)}")
    index_path = os.path.join(folder, "model_index.json")
    if not os.path.isfile(index_path):
        raise Wan22InputError("model_folder", f"{name} has no model_index.json: pick a diffusers Wan2.2 folder "
                                              "(with transformer/ and transformer_2/) under models/diffusers")
    try:
        with open(index_path) as f:
            model_index = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise Wan22InputError("model_folder", f"{name}/model_index.json cannot be read ({e})") from None
    configs: dict[str, WanExpertConfig] = {}
    for role in DIFFUSERS_CHOICES[experts]:
        sub = os.path.join(folder, DIFFUSERS_SUBFOLDERS[role])
        config_path = os.path.join(sub, "config.json")
        if not os.path.isfile(config_path):
            other = "low_noise_only" if role == "high_noise" else "high_noise_only"
            raise Wan22InputError("experts", f"{name} has no {DIFFUSERS_SUBFOLDERS[role]}/ ({role.replace('_', '-')}"
                                             f" expert): choose experts = {other}, or a folder that has it")
        with open(config_path) as f:
            config = json.load(f)
        if config.get("_class_name") != "WanTransformer3DModel" or config.get("in_channels") not in TASKS:
            raise Wan22InputError("model_folder", f"{name}/{DIFFUSERS_SUBFOLDERS[role]} is not a Wan2.2 A14B "
                                                  "transformer; pick a Wan2.2 A14B diffusers folder")
        for weights in _diffusers_weight_files(sub):
            try:
                checkpoint.read_header(weights)
            except checkpoint.CheckpointFileError as e:
                raise Wan22InputError("model_folder", f"{e}; download the folder again") from None
        configs[role] = WanExpertConfig.from_diffusers_config(config)
    check_matching(configs, {r: f"{name}/{DIFFUSERS_SUBFOLDERS[r]}" for r in configs})
    declared = model_index.get("boundary_ratio")
    return configs, (float(declared) if declared is not None else None)


def load_diffusers_experts(folder: str, experts: str = "both", weight_dtype: str = "default",
                           on_loaded=None) -> Wan22Experts:
    configs, declared_boundary = inspect_diffusers_folder(folder, experts)
    config = next(iter(configs.values()))
    first = _diffusers_weight_files(os.path.join(folder, DIFFUSERS_SUBFOLDERS[next(iter(configs))]))[0]
    dtype = _resolve_dtype(weight_dtype, checkpoint.stored_float_dtype(checkpoint.read_header(first)[0]))
    models = {}
    for role in configs:
        model = WanTransformer3DModel.from_pretrained(folder, subfolder=DIFFUSERS_SUBFOLDERS[role], torch_dtype=dtype,
                                                      use_safetensors=True, local_files_only=True)
        with torch.no_grad():  # own the weights: mapped file tensors are mis-aligned for the CPU kernels
            for param in model.parameters():
                param.data = param.data.clone()
        models[role] = model.eval().requires_grad_(False)
        if on_loaded:
            on_loaded()
    name = os.path.basename(os.path.normpath(folder))
    sources = tuple(f"{name}/{DIFFUSERS_SUBFOLDERS[r]}" if r in models else "none" for r in ("high_noise", "low_noise"))
    return Wan22Experts(high_noise=models.get("high_noise"), low_noise=models.get("low_noise"), config=config,
                        dtype=dtype, sources=sources,
                        default_boundary=default_boundary(config, declared_boundary))
