"""The architecture of a Wan2.2 A14B expert, read off its tensors the way ComfyUI reads it (the files
store no head count), and the check that two experts belong together.

Used before anything is loaded (a file's header is enough), so a wrong file is refused at queue time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import Wan22InputError

HEAD_DIM = 128  # Wan's attention head width: ComfyUI derives num_heads = dim // 128 the same way
# In-channels: 16 noise; image-to-video (and Fun-InP, the same layout) adds 4 mask + 16 start-image channels;
# Fun-Control adds 16 control-video + 4 mask + 16 start-image channels (Wan22FunControlToVideo's layout).
# 48: TI2V-5B, one transformer (not a pair of experts) on the Wan2.2 VAE's 48-channel latent, its start image in
# the latent itself (Wan22ImageToVideoLatent).
TASKS = {16: "t2v", 36: "i2v", 52: "fun_control", 48: "ti2v"}
TASK_WORDS = {"t2v": "text-to-video", "i2v": "image-to-video", "fun_control": "Fun-Control",
              "ti2v": "TI2V-5B text-and-image-to-video"}
TASK_LABELS = {"t2v": "T2V", "i2v": "I2V", "fun_control": "Fun-Control", "ti2v": "TI2V-5B"}
SINGLE = "ti2v"  # the task of a model that is one transformer: it runs alone
# ref_conv: Fun-Control's reference image embedding (ComfyUI puts its tokens in front of the sequence);
# control_adapter: Fun-Camera's camera adapter (ComfyUI's CameraWanModel adds it to the patch embedding, before the
# block loop, which is the plain one: the cache applies unchanged)
# vace_*: VACE-Fun's control stream (ComfyUI's VaceWanModel): a patch embedding of the control frames and masks, and
# VACE blocks whose hints are added after given main blocks (the cache keeps them fresh: nodes/vace_hints.py)
WAN_TOP_LEVEL = {"patch_embedding", "text_embedding", "time_embedding", "time_projection", "blocks", "head", "ref_conv",
                 "control_adapter", "vace_patch_embedding", "vace_blocks"}
CAMERA_TENSOR = "control_adapter.conv.weight"
VACE_TENSOR = "vace_patch_embedding.weight"
# ComfyUI's Wan transformers whose forward adds work between the blocks (by class name, with the model type its
# detection gives them), and what a block cache, which runs the blocks as one unit, would drop.
# (VACE adds its control hints between the blocks too; the pack computes them on every step itself.)
BETWEEN_BLOCKS = {
    "WanModel_S2V": ("s2v", "S2V injects the audio into the hidden state after given blocks (its audio injector), so "
                            "a block cache that skips those blocks would drop the audio's change on every cached "
                            "step"),
    "AnimateWanModel": ("animate", "Animate adds its face adapter's motion to the hidden state after every fifth "
                                   "block, so a block cache that skips those blocks would drop the face's change on "
                                   "every cached step"),
}
UNCACHED_HINT = "run it without Cache-DiT, with ComfyUI's own nodes"


def between_blocks(class_name: str = "", model_type: str = "") -> str | None:
    """What a block cache would drop on ComfyUI's Wan transformer of this class (or detected model type), or
    None where its block loop is the plain one."""
    return next((why for name, (kind, why) in BETWEEN_BLOCKS.items() if class_name == name or model_type == kind),
                None)
REQUIRED_TENSORS = ("patch_embedding.weight", "head.modulation", "head.head.weight", "blocks.0.ffn.0.weight",
                    "text_embedding.0.weight")


@dataclass(frozen=True)
class ExpertArchitecture:
    """What must match between the two experts of one Wan2.2 model."""

    dim: int
    num_layers: int
    in_channels: int
    out_channels: int
    ffn_dim: int
    text_dim: int
    camera: bool = False  # a Fun-Camera expert (image-to-video with a camera adapter)
    vace_layers: int = 0  # a VACE-Fun expert's VACE blocks (text-to-video layout with a control stream), else 0

    @property
    def task(self) -> str:
        return TASKS[self.in_channels]

    @property
    def label(self) -> str:
        return "Fun-Camera" if self.camera else "VACE-Fun" if self.vace_layers else TASK_LABELS[self.task]

    @property
    def heads(self) -> int:
        """Attention heads (A14B: 5120 wide, 40 heads)."""
        return self.dim // HEAD_DIM

    def describe(self) -> str:
        kind = "Fun-Camera " if self.camera else "VACE-Fun " if self.vace_layers else ""
        vace = f", {self.vace_layers} VACE blocks" if self.vace_layers else ""
        return (f"{kind}{TASK_WORDS[self.task]}, width {self.dim}, {self.num_layers} layers{vace}, "
                f"{self.in_channels} in-channels")


def not_an_expert(input_name: str, what: str, why: str) -> Wan22InputError:
    return Wan22InputError(input_name, f"{what} is not a Wan2.2 A14B expert ({why}); use a Wan2.2 high-noise or "
                                       "low-noise diffusion model")


def check_task(in_channels: int, input_name: str, what: str) -> None:
    if in_channels not in TASKS:
        raise not_an_expert(input_name, what, f"{in_channels} input channels; the A14B experts have 16 "
                                              "(text-to-video), 36 (image-to-video, Fun-InP) or 52 (Fun-Control), "
                                              "TI2V-5B has 48")


def architecture_from_shapes(shapes: dict[str, list[int]], input_name: str, what: str) -> ExpertArchitecture:
    """The architecture of a single file's tensors (original Wan layout, prefix stripped)."""
    missing = [k for k in REQUIRED_TENSORS if k not in shapes]
    if missing:
        raise not_an_expert(input_name, what, f"missing tensor {missing[0]}" if shapes else "no tensors")
    extra = sorted({name.split(".")[0] for name in shapes} - WAN_TOP_LEVEL - {"scaled_fp8"})
    if extra:
        raise not_an_expert(input_name, what, f"unexpected tensors {', '.join(x + '.*' for x in extra[:4])}: Wan2.1 "
                                              "image, S2V or Animate models are not Wan2.2 A14B experts")
    patch = shapes["patch_embedding.weight"]  # [dim, in_channels, 1, 2, 2]
    dim = shapes["head.modulation"][-1]
    if len(patch) != 5 or patch[0] != dim or dim % HEAD_DIM:
        raise not_an_expert(input_name, what, f"patch embedding {patch} does not fit a Wan transformer of width {dim}")
    check_task(patch[1], input_name, what)
    layers = {int(m.group(1)) for name in shapes if (m := re.match(r"blocks\.(\d+)\.", name))}
    patch_volume = patch[2] * patch[3] * patch[4]
    camera = CAMERA_TENSOR in shapes
    if camera and TASKS[patch[1]] != "i2v":
        raise not_an_expert(input_name, what, f"a camera adapter on a {patch[1]}-channel model: the Wan2.2 Fun-Camera "
                                              "experts take 36 (image-to-video)")
    vace_layers = len({m.group(1) for name in shapes if (m := re.match(r"vace_blocks\.(\d+)\.", name))})
    if (VACE_TENSOR in shapes) != bool(vace_layers):
        raise not_an_expert(input_name, what, "VACE tensors without both the VACE patch embedding and VACE blocks: "
                                              "the Wan2.2 VACE-Fun experts have both")
    if vace_layers and TASKS[patch[1]] != "t2v":
        raise not_an_expert(input_name, what, f"VACE blocks on a {patch[1]}-channel model: the Wan2.2 VACE-Fun "
                                              "experts take 16 (the text-to-video layout)")
    return ExpertArchitecture(dim=dim, num_layers=max(layers) + 1, in_channels=patch[1],
                              out_channels=shapes["head.head.weight"][0] // patch_volume,
                              ffn_dim=shapes["blocks.0.ffn.0.weight"][0], text_dim=shapes["text_embedding.0.weight"][1],
                              camera=camera, vace_layers=vace_layers)


def check_matching(architectures: dict[str, ExpertArchitecture], names: dict[str, str],
                   input_name: str = "low_noise_model") -> None:
    """Two experts (keyed by role) must be the two halves of one model; the error says which dimension
    differs. It names `input_name`, by default the low-noise input: the one people swap."""
    if len(architectures) < 2:
        return
    high, low = architectures["high"], architectures["low"]
    if SINGLE in (high.task, low.task):
        raise Wan22InputError(input_name, f"{names['high'] if high.task == SINGLE else names['low']} is TI2V-5B, one "
                                          "transformer rather than a pair of experts: load it in one input and leave "
                                          "the other empty")
    for field, label in (("in_channels", "in-channels"), ("dim", "width"), ("num_layers", "depth (layers)"),
                         ("ffn_dim", "feed-forward width"), ("text_dim", "text width"),
                         ("out_channels", "out-channels"), ("camera", "camera adapter"),
                         ("vace_layers", "VACE blocks")):
        a, b = getattr(high, field), getattr(low, field)
        if a != b:
            hint = {"in_channels": " (one is text-to-video, the other image-to-video)",
                    "camera": " (one is a Fun-Camera expert, the other not)",
                    "vace_layers": " (one is a VACE-Fun expert, the other not)"}.get(field, "")
            raise Wan22InputError(input_name, f"the experts do not match: {label} {a} in {names['high']} vs "
                                                     f"{b} in {names['low']}{hint}; use the high-noise and "
                                                     "low-noise experts of the same Wan2.2 model")
