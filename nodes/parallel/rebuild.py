"""How a worker makes the same MODEL as ComfyUI's process: what a MODEL sends (`model_spec`, in ComfyUI's
process), what it may carry for that to hold, and the clone a worker makes of it (`rebuilt`).

A worker loads each expert itself through the loader factory the MODEL came from (ComfyUI's
`cached_patcher_init`) and puts the run's weight patches on a clone of it (`rebuilt`). Every field of a
ComfyUI ModelPatcher is named in FIELDS with what becomes of it; `unrebuildable` refuses a MODEL whose fields
hold anything a worker would not rebuild. A field ComfyUI adds later is named nowhere: the pack's test of this
table fails on it, instead of workers silently differing from one process.
"""

from __future__ import annotations

import sys

from ..core.errors import Wan22InputError
from ..core.experts import ROLE_WORDS
from .gate import ray_module

# Object patches ComfyUI's own nodes put on a Wan MODEL that the workers rebuild: the flow shift
# (ModelSamplingSD3), which every stage sets again from the schedule.
REBUILT_OBJECT_PATCHES = ("model_sampling",)
# The transformer option the workers take along: an attention override (sage, flash, a Model Attention Backend
# node), sent to them by value and run by the sequence split as its inner attention.
ATTENTION_OVERRIDE = "optimized_attention_override"
# Attachments that are plain data, sent along and attached again: the header of a LoRA file, which ComfyUI's LoRA
# loaders attach to every MODEL they patch (nothing in sampling reads it).
SENT_ATTACHMENTS = ("lora_metadata",)

# Every field of a ModelPatcher (ComfyUI 0.30.0), by what becomes of it on a worker:
FIELDS = {
    # made again by the loader factory, or the worker's own state while it runs
    "loaded": ("model", "size", "load_device", "offload_device", "weight_inplace_update", "cached_patcher_init",
               "is_multigpu_base_clone", "clone_base_uuid", "parent", "is_clip", "pinned", "backup",
               "backup_buffers", "object_patches_backup", "hook_patches_backup", "hook_backup",
               "cached_hook_patches", "current_hooks", "forced_hooks", "hook_mode", "is_injected",
               "skip_injection", "force_cast_weights"),
    # sent to the workers and put on their clone (`rebuilt`)
    "sent": ("patches", "patches_uuid", "model_options"),
    # refused when they hold anything (`unrebuildable`), but for REBUILT_OBJECT_PATCHES, ATTENTION_OVERRIDE and
    # SENT_ATTACHMENTS
    "refused": ("object_patches", "wrappers", "callbacks", "weight_wrapper_patches", "additional_models",
                "injections", "hook_patches", "attachments"),
}


def unrebuildable(model) -> list[str]:
    """What a MODEL carries beyond its file and its weight patches: Python objects (wrappers, callbacks, model
    and attention patches) that a worker process cannot rebuild, each named for the user."""
    found = [f"object patch {key}" for key in model.object_patches if key not in REBUILT_OBJECT_PATCHES]
    options = model.model_options
    found += [f"model option {key}" for key, value in options.items() if key != "transformer_options" and value]
    found += [f"transformer option {key}" for key, value in options.get("transformer_options", {}).items()
              if value and key != ATTENTION_OVERRIDE]
    for kind, by_key in model.wrappers.items():
        found += [f"{kind} wrapper {key}" for key, wrappers in by_key.items() if wrappers]
    for kind, by_key in model.callbacks.items():
        found += [f"{kind} callback {key}" for key, callbacks in by_key.items() if callbacks]
    found += [f"weight wrapper {key}" for key in model.weight_wrapper_patches]
    found += [f"additional model {key}" for key in model.additional_models]
    found += [f"injection {key}" for key, injections in model.injections.items() if injections]
    found += [f"hook patch {key}" for key in (model.hook_patches or {})]
    found += [f"attachment {key}" for key in (getattr(model, "attachments", None) or {})
              if key not in SENT_ATTACHMENTS]
    found += [f"weight patch with a function on {key}" for key, patches in model.patches.items()
              if any(len(p) > 4 and p[4] is not None for p in patches)]
    return found


def rebuilt(base, spec: dict):
    """A clone of the worker's own copy of the expert (`base`, from the loader factory) with what `spec` sent:
    the run's weight patches, the MODEL's attention override and its data attachments."""
    model = base.clone()
    model.patches = {key: list(patches) for key, patches in spec["patches"].items()}
    model.patches_uuid = spec["patches_uuid"]  # the received MODEL's: unchanged patches stay applied
    if spec.get("attention") is not None:  # the MODEL's attention override, inside the sequence split
        model.model_options.setdefault("transformer_options", {})[ATTENTION_OVERRIDE] = spec["attention"]
    for key, value in spec.get("attachments", {}).items():
        model.set_attachments(key, value)
    return model


def sent_attachments(model) -> dict:
    """The MODEL's data attachments (SENT_ATTACHMENTS), by value, for `rebuilt`."""
    return {key: value for key, value in (getattr(model, "attachments", None) or {}).items()
            if key in SENT_ATTACHMENTS}


def model_spec(model, role: str) -> dict:
    """How a worker makes the same MODEL: ComfyUI's loader factory for it, and its weight patches. A MODEL that
    carries anything else is refused before any worker starts, naming what."""
    what = f"the {ROLE_WORDS.get(role, role)} expert" if role != "lead" else "the lead stage's expert"
    init = getattr(model, "cached_patcher_init", None)
    if init is None:
        raise Wan22InputError("workers", f"{what} comes from a loader that does not tell ComfyUI how to load it again "
                                         "(its cached_patcher_init; GGUF loaders do not), so the workers cannot "
                                         "load it themselves: load it with Load Wan2.2 Experts, Load Diffusion "
                                         "Model or Load Wan2.2 Experts (Diffusers), or run without the plan")
    found = unrebuildable(model)
    if found:
        raise Wan22InputError("workers", f"{what} carries model patches the workers cannot rebuild "
                                         f"({', '.join(found[:4])}): remove the node that adds them, or run without "
                                         "the parallel plan")
    return {"init": init, "key": repr((getattr(init[0], "__module__", ""), getattr(init[0], "__qualname__", ""),
                                        init[1:])),
            "patches": {key: list(patches) for key, patches in model.patches.items()},
            "patches_uuid": model.patches_uuid, "attention": attention_override(model, what),
            "attachments": sent_attachments(model)}


def attention_override(model, what: str):
    """The MODEL's attention override, ready to be sent to the workers: the module that defines it (another
    custom node pack, which a worker does not load) goes by value. One that cannot be sent is refused by name."""
    override = model.model_options.get("transformer_options", {}).get(ATTENTION_OVERRIDE)
    if override is None:
        return None
    ray = ray_module()
    name = getattr(override, "__module__", None) or ""
    module = sys.modules.get(name)
    own = name.split(".")[0] in ("comfy", "comfy_extras", "comfy_api", __name__.split(".")[0])
    if module is not None and not own:
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        ray.cloudpickle.dumps(override)
    except Exception as e:
        raise Wan22InputError("workers", f"{what} carries an attention override "
                                         f"({getattr(override, '__qualname__', type(override).__name__)} from "
                                         f"{name or 'an unknown module'}) that cannot be sent to the workers "
                                         f"({type(e).__name__}: {e}): remove the node that sets it, or run "
                                         "without the parallel plan") from None
    return override
