"""LoRA per expert: the LoRA set is part of the handle (a value); the sampler applies it for its run.

Files are read with diffusers' own Wan LoRA conversion (ComfyUI/kohya `lora_down`/`lora_up`/`alpha`
under `diffusion_model.`, LightX2V's extra `diff_b`/`diff` keys, musubi `lora_unet_*`, and diffusers/PEFT
files as they are) and applied as unmerged PEFT adapters through diffusers' `load_lora_adapter`, so the
shared expert weights are never changed: what a run sees is exactly the adapters its handle asks for.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from . import checkpoint
from .errors import Wan22InputError

LORA_INPUTS = {"high": "high_noise_lora", "low": "low_noise_lora"}
STRENGTH_INPUTS = {"high": "high_noise_strength", "low": "low_noise_strength"}
ADAPTER_PREFIX = "wan22_lora_"
# What diffusers' Wan conversion leaves out of ComfyUI/kohya files: norm differences (zero in LightX2V's
# files), full-weight differences other than the head's, and modulation differences (`diff_m`).
_LEFT_OUT = re.compile(r"(norm[^.]*\.diff(_b)?|(?<!^head\.head)\.diff|diff_m)$")
log = logging.getLogger("wan22_cachedit")
_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_B.bias")


@dataclass(frozen=True, eq=False)
class LoraFile:
    """One LoRA file, converted to diffusers/PEFT names (no `transformer.` prefix), in the experts' dtype.

    Compared by identity: two uses of the same object share one adapter's weights."""

    name: str
    state_dict: dict[str, torch.Tensor] = field(repr=False)
    rank: int
    layers: int  # how many linear layers it adapts
    left_out: tuple[str, ...] = ()  # non-zero tensors of the file that the conversion does not apply
    metadata: dict | None = field(default=None, repr=False)  # a diffusers/PEFT file's LoRA config (alpha, rank)


@dataclass(frozen=True)
class LoraUse:
    role: str  # "high" | "low"
    lora: LoraFile
    strength: float

    def describe(self) -> dict:
        return {"file": self.lora.name, "strength": self.strength, "rank": self.lora.rank,
                "layers": self.lora.layers}


def check_file(path: str, input_name: str) -> None:
    """Header-only check (cheap enough for prompt validation): a missing, truncated or corrupt file."""
    try:
        checkpoint.read_header(path)
    except checkpoint.CheckpointFileError as e:
        raise Wan22InputError(input_name, f"{e}; download the LoRA again or pick another one") from None


def read_lora(path: str, input_name: str, dtype: torch.dtype) -> LoraFile:
    """Reads and converts one LoRA file; any file diffusers cannot read as a Wan LoRA is refused by name."""
    from diffusers.loaders.lora_pipeline import WanLoraLoaderMixin

    name = os.path.basename(path)
    check_file(path, input_name)
    try:
        converted, metadata = WanLoraLoaderMixin.lora_state_dict(path, return_lora_metadata=True)
    except Exception as e:  # diffusers' converters raise bare ValueError/KeyError on foreign layouts
        raise Wan22InputError(input_name, f"{name} is not a Wan LoRA that diffusers can read "
                                          f"({type(e).__name__}: {e}); pick a Wan2.2 A14B LoRA") from None
    prefixed = {k[len("transformer."):]: v for k, v in converted.items() if k.startswith("transformer.")}
    state_dict = prefixed or converted  # a bare PEFT state dict has no component prefix
    unknown = tuple(k for k in state_dict if not k.endswith(_SUFFIXES))
    state_dict = {k: v for k, v in state_dict.items() if k.endswith(_SUFFIXES)}
    if metadata:  # saved by diffusers/PEFT: its config decides alpha and ranks, as in diffusers' own loading
        metadata = {k[len("transformer."):]: v for k, v in metadata.items() if k.startswith("transformer.")} or None
    if not any(k.endswith(".lora_A.weight") for k in state_dict):
        raise Wan22InputError(input_name, f"{name} is not a Wan LoRA: it holds no LoRA layers (keys like "
                                          f"{next(iter(converted), 'none')}); a model file goes in a loader, "
                                          "pick a Wan2.2 A14B LoRA here")
    state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    ranks = [v.shape[0] for k, v in state_dict.items() if k.endswith(".lora_A.weight")]
    left_out = nonzero_left_out(path) + unknown
    if left_out:
        log.warning("[wan22] %s: %d tensors are not applied (diffusers' Wan LoRA conversion does not support "
                    "them), e.g. %s", name, len(left_out), ", ".join(left_out[:3]))
    return LoraFile(name=name, state_dict=state_dict, rank=max(ranks), layers=len(ranks), left_out=left_out,
                    metadata=metadata)


def nonzero_left_out(path: str) -> tuple[str, ...]:
    """The tensors of a ComfyUI/kohya file that diffusers' conversion drops and that are not all zero."""
    from safetensors import safe_open

    prefix = "diffusion_model."
    with safe_open(path, framework="pt") as f:
        return tuple(key[len(prefix):] for key in f.keys()
                     if key.startswith(prefix) and _LEFT_OUT.search(key[len(prefix):])
                     and bool(f.get_tensor(key).any()))


def check_fits(lora: LoraFile, module: torch.nn.Module, input_name: str) -> None:
    """Every layer the LoRA adapts must exist in the expert with the LoRA's shapes; the error names the
    file and the first layer that does not fit (a LoRA for another model matches neither expert)."""
    modules = dict(module.named_modules())
    misfits = []
    for key, tensor in lora.state_dict.items():
        target, _, kind = key.rpartition(".lora_")
        layer = modules.get(target)
        layer = getattr(layer, "base_layer", layer)  # an adapter already installed wraps the Linear
        if not isinstance(layer, torch.nn.Linear):
            misfits.append(f"{target} is not a linear layer of these experts")
            continue
        expected = {"A.weight": (tensor.shape[0], layer.in_features), "B.weight": (layer.out_features, tensor.shape[-1]),
                    "B.bias": (layer.out_features,)}[kind]
        if tuple(tensor.shape) != expected:
            misfits.append(f"{key} has shape {list(tensor.shape)}, the expert needs {list(expected)}")
    if misfits:
        raise Wan22InputError(input_name, f"{lora.name} does not fit these experts: {misfits[0]} ({len(misfits)} "
                                          f"of its {len(lora.state_dict)} tensors do not fit). It is a LoRA for "
                                          "another model; pick one trained for Wan2.2 A14B (14B)")


# --- the installed state: PEFT adapters on the expert modules; this table remembers which uses put them there ---

_APPLIED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[LoraFile, float], ...]]" = \
    weakref.WeakKeyDictionary()


def adapter_names(module: torch.nn.Module) -> list[str]:
    return list(getattr(module, "peft_config", None) or {})


def leftovers(module: torch.nn.Module) -> list[str]:
    """Any trace of PEFT on a module (empty when no adapter is installed)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found = [name for name, sub in module.named_modules() if isinstance(sub, BaseTunerLayer)]
    found += [f"peft_config:{n}" for n in adapter_names(module)]
    if "_hf_peft_config_loaded" in vars(module):
        found.append("_hf_peft_config_loaded")
    return found


def remove(module: torch.nn.Module) -> None:
    """Takes every adapter off an expert: its layers are then the loaded ones again."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if adapter_names(module) or any(isinstance(m, BaseTunerLayer) for m in module.modules()):
        module.unload_lora()
    vars(module).pop("_hf_peft_config_loaded", None)  # unload_lora leaves an instance attribute behind
    _APPLIED.pop(module, None)


def wanted(experts, role: str) -> tuple[tuple[LoraFile, float], ...]:
    """The adapters a handle asks for on one expert. Strength 0 is no adapter at all (as ComfyUI's own
    LoRA loader skips it), so it is exactly the run without the LoRA."""
    return tuple((use.lora, use.strength) for use in experts.loras if use.role == role and use.strength != 0.0)


def _same_files(a, b) -> bool:
    return len(a) == len(b) and all(x is y for (x, _), (y, _) in zip(a, b))


def reconcile(experts) -> None:
    """Makes the adapters on each loaded expert exactly the handle's LoRA set, with its strengths.

    The same files as last time keep their adapters (only the strengths are set); anything else is
    unloaded and loaded afresh. A failure leaves the expert with no adapter at all, never half a set."""
    from .cache import loaded_targets

    for role, module in loaded_targets(experts).items():
        want = wanted(experts, role)
        have = _APPLIED.get(module, ())
        names = [f"{ADAPTER_PREFIX}{i}" for i in range(len(want))]
        try:
            if not (_same_files(want, have) and adapter_names(module) == names):
                remove(module)
                for adapter, (lora, _) in zip(names, want):
                    with warnings.catch_warnings():  # PEFT warns on every adapter after the first
                        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                        # low_cpu_mem_usage: the adapter's parameters are the file's tensors, not a copy
                        module.load_lora_adapter(dict(lora.state_dict), prefix=None, adapter_name=adapter,
                                                 metadata=lora.metadata, low_cpu_mem_usage=True)
                    module.requires_grad_(False)
            if want:
                module.set_adapters(names, weights=[float(strength) for _, strength in want])
        except BaseException:
            remove(module)
            raise
        _APPLIED[module] = want
