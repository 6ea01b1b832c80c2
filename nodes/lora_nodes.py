"""Wan2.2 LoRA (per expert): a LoRA for each expert, applied the way ComfyUI's own LoRA loader applies it
(on a clone of that expert's MODEL), on a new handle."""

from __future__ import annotations

import math

import folder_paths
from comfy_api.latest import io

import comfy.lora
import comfy.lora_convert
import comfy.sd
import comfy.utils
import comfy.weight_adapter

from .core import checkpoint
from .core.errors import Wan22InputError
from .core.experts import NONE, ROLE_WORDS, ROLES, LoraNote
from .model_files import model_file_path
from .types import CATEGORY, ExpertsType, linked_given, linked_only

LORA_INPUTS = {"high": "high_noise_lora", "low": "low_noise_lora"}
STRENGTH_INPUTS = {"high": "high_noise_strength", "low": "low_noise_strength"}


def lora_path(role: str, name: str) -> str | None:
    return model_file_path("loras", LORA_INPUTS[role], name)


def strength_input(role: str) -> io.Float.Input:
    return io.Float.Input(STRENGTH_INPUTS[role], default=1.0, min=-100.0, max=100.0, step=0.01,
                          tooltip=f"How strongly the LoRA changes the {ROLE_WORDS[role]} expert: 1.0 as trained, "
                                  "0 = no LoRA (bit-identical to leaving it out), negative values invert it.")


def lora_patches(model, lora: dict, input_name: str, name: str) -> dict:
    """The patches ComfyUI's LoRA loading makes of `lora` for this MODEL, checked to fit it: a file that
    patches nothing, or patches of another model's shapes, is refused by name (ComfyUI would only log it)."""
    key_map = comfy.lora.model_lora_keys_unet(model.model, {})
    patches = comfy.lora.load_lora(comfy.lora_convert.convert_lora(dict(lora)), key_map, log_missing=False)
    if not patches:
        raise Wan22InputError(input_name, f"{name} is not a LoRA for these experts: none of its {len(lora)} tensors "
                                          f"(e.g. {next(iter(lora), 'none')}) matches a layer of a Wan model; a "
                                          "model file goes in a loader, pick a Wan2.2 A14B LoRA here")
    shapes = {key: weight_shape(model, key) for key in patches}
    misfits = [f"{key}: {got} for a weight of {shapes[key]}" for key, patch in patches.items()
               if (got := misfit(patch, shapes[key]))]
    if misfits:
        raise Wan22InputError(input_name, f"{name} does not fit these experts: {misfits[0]} ({len(misfits)} of its "
                                          f"{len(patches)} layers do not fit). It is a LoRA for another model; pick "
                                          "one trained for Wan2.2 A14B (14B)")
    return patches


def weight_shape(model, key) -> list[int] | None:
    """The shape of the model's weight `key` as the model computes with it, read off the parameter itself: a
    quantized weight (GGUF's, whose stored bytes have another shape) gives its logical shape, as its layer
    reports it. None when the key is not a single weight of the model."""
    if not isinstance(key, str):
        return None
    try:
        weight = comfy.utils.get_attr(model.model, key)
    except AttributeError:
        return None
    return [int(d) for d in weight.shape] if hasattr(weight, "shape") else None


def misfit(patch, shape: list[int] | None) -> str | None:
    """What is wrong with one patch for a weight of `shape` (None when it fits, or when it cannot be told)."""
    if not shape:
        return None
    if isinstance(patch, comfy.weight_adapter.LoRAAdapter):
        up, down = patch.weights[0], patch.weights[1]
        if up.shape[0] != shape[0] or down.reshape(down.shape[0], -1).shape[1] != math.prod(shape[1:]):
            return f"up {list(up.shape)} / down {list(down.shape)}"
    elif isinstance(patch, tuple) and patch[0] == "diff" and list(patch[1][0].shape) != shape:
        return f"a difference of {list(patch[1][0].shape)}"
    return None


class Wan22LoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = [NONE] + folder_paths.get_filename_list("loras")
        return io.Schema(
            node_id="Wan22LoraLoader",
            display_name="Wan2.2 LoRA (per expert)",
            category=CATEGORY,
            description="Adds a LoRA to each expert separately (e.g. LightX2V's 4-step high-noise and low-noise "
                        "LoRAs), as ComfyUI's LoraLoaderModelOnly does: on clones, in a new handle, so the experts "
                        "this node received are not changed. Chain several nodes for several LoRAs.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts to add LoRAs to; other branches using the same "
                                                     "experts without this node run without them."),
                io.Combo.Input("high_noise_lora", options=files, default=NONE,
                               tooltip="LoRA for the high-noise expert, from models/loras (any format ComfyUI reads: "
                                       "ComfyUI/kohya, LightX2V, musubi). 'none' = no LoRA on it."),
                strength_input("high"),
                io.Combo.Input("low_noise_lora", options=files, default=NONE,
                               tooltip="LoRA for the low-noise expert, from models/loras. 'none' = no LoRA on it."),
                strength_input("low"),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts with these LoRAs added "
                                                                       "(after any LoRAs already on them).")],
        )

    @classmethod
    def validate_inputs(cls, high_noise_lora=None, low_noise_lora=None, experts=None):
        linked = linked_only(experts=experts)
        if linked is not True:
            return linked
        # Header-only checks: a missing or damaged file is refused at queue time.
        for role, name in (("high", high_noise_lora), ("low", low_noise_lora)):
            try:
                path = lora_path(role, name) if name is not None else None
                if path is not None:
                    checkpoint.check_file(path, LORA_INPUTS[role], "LoRA")
            except Wan22InputError as e:
                return str(e)
        return True

    @classmethod
    def execute(cls, experts, high_noise_lora, high_noise_strength, low_noise_lora,
                low_noise_strength) -> io.NodeOutput:
        linked_given(experts=experts)
        models = experts.models()
        chosen = {"high": (high_noise_lora, high_noise_strength), "low": (low_noise_lora, low_noise_strength)}
        notes = []
        for role in ROLES:
            name, strength = chosen[role]
            path = lora_path(role, name)
            if path is None:
                continue
            if role not in models:
                raise Wan22InputError(LORA_INPUTS[role], f"{name} is for the {ROLE_WORDS[role]} expert, which is not "
                                                         f"loaded: set {LORA_INPUTS[role]} to 'none' or load that "
                                                         "expert")
            checkpoint.check_file(path, LORA_INPUTS[role], "LoRA")
            lora, metadata = comfy.utils.load_torch_file(path, safe_load=True, return_metadata=True)
            patched = len(lora_patches(models[role], lora, LORA_INPUTS[role], name))
            if strength != 0:  # as ComfyUI's LoRA loader, strength 0 leaves the model as it is
                models[role], _ = comfy.sd.load_lora_for_models(models[role], None, lora, strength, 0,
                                                                lora_metadata=metadata)
            notes.append(LoraNote(role=role, file=name, strength=float(strength), patched_weights=patched))
        result = experts.replace(high=models.get("high"), low=models.get("low"), loras=experts.loras + tuple(notes))
        text = [f"{ROLE_WORDS[n.role]}: {n.file} x{n.strength:g} ({n.patched_weights} weights patched)"
                for n in result.loras]
        return io.NodeOutput(result, ui={"text": ["\n".join(text) or "no LoRA"]})
