"""Wan2.2 LoRA (per expert): puts a LoRA for each expert on a new handle (the sampler applies it)."""

from __future__ import annotations

import folder_paths
from comfy_api.latest import io

from .core import lora as core
from .core.errors import Wan22InputError
from .loader_nodes import NONE, model_file_path
from .types import CATEGORY, ExpertsType

ROLE_WORDS = {"high": "high-noise", "low": "low-noise"}


def lora_path(input_name: str, name: str) -> str | None:
    return model_file_path("loras", input_name, name)


def strength_input(role: str) -> io.Float.Input:
    return io.Float.Input(core.STRENGTH_INPUTS[role], default=1.0, min=-100.0, max=100.0, step=0.01,
                          tooltip=f"How strongly the LoRA changes the {ROLE_WORDS[role]} expert: 1.0 as trained, "
                                  "0 = no LoRA (bit-identical to leaving it out), negative values invert it.")


class Wan22LoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = [NONE] + folder_paths.get_filename_list("loras")
        return io.Schema(
            node_id="Wan22LoraLoader",
            display_name="Wan2.2 LoRA (per expert)",
            category=CATEGORY,
            description="Adds a LoRA for each expert separately (e.g. LightX2V's 4-step high-noise and low-noise "
                        "LoRAs). Returns a new handle: the shared experts are not changed, the sampler applies "
                        "the LoRAs for its own run. Chain several nodes for several LoRAs.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts to add LoRAs to; other branches using the same "
                                                     "experts without this node run without them."),
                io.Combo.Input("high_noise_lora", options=files, default=NONE,
                               tooltip="LoRA for the high-noise expert, from models/loras (ComfyUI/kohya, "
                                       "LightX2V or diffusers format). 'none' = no LoRA on it."),
                strength_input("high"),
                io.Combo.Input("low_noise_lora", options=files, default=NONE,
                               tooltip="LoRA for the low-noise expert, from models/loras. 'none' = no LoRA on it."),
                strength_input("low"),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts with these LoRAs added "
                                                                       "(after any LoRAs already on the handle).")],
        )

    @classmethod
    def validate_inputs(cls, high_noise_lora, low_noise_lora):
        # Header-only checks: a missing or damaged file is refused at queue time.
        for role, name in (("high", high_noise_lora), ("low", low_noise_lora)):
            input_name = core.LORA_INPUTS[role]
            try:
                path = lora_path(input_name, name or NONE)
                if path is not None:
                    core.check_file(path, input_name)
            except Wan22InputError as e:
                return str(e)
        return True

    @classmethod
    def execute(cls, experts, high_noise_lora, high_noise_strength, low_noise_lora,
                low_noise_strength) -> io.NodeOutput:
        modules = {"high": experts.high_noise, "low": experts.low_noise}
        uses = []
        for role, name, strength in (("high", high_noise_lora, high_noise_strength),
                                     ("low", low_noise_lora, low_noise_strength)):
            input_name = core.LORA_INPUTS[role]
            path = lora_path(input_name, name)
            if path is None:
                continue
            if modules[role] is None:
                raise Wan22InputError(input_name, f"{name} is for the {ROLE_WORDS[role]} expert, which is not "
                                                  f"loaded: set {input_name} to 'none' or load that expert")
            lora = core.read_lora(path, input_name, experts.dtype)
            core.check_fits(lora, modules[role], input_name)
            uses.append(core.LoraUse(role, lora, float(strength)))
        result = experts.replace(loras=experts.loras + tuple(uses))
        text = [f"{ROLE_WORDS[u.role]}: {u.lora.name} x{u.strength:g} (rank {u.lora.rank}, {u.lora.layers} layers"
                + (f"; {len(u.lora.left_out)} tensors not applied, e.g. {u.lora.left_out[0]}" if u.lora.left_out
                   else "") + ")" for u in result.loras] or ["no LoRA"]
        return io.NodeOutput(result, ui={"text": ["\n".join(text)]})
