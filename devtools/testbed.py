"""The trained test beds: tiny two-expert Wan2.2 models that denoise, for every quality figure the pack states.

Random-weight experts prove plumbing and equality, but they do not denoise, so a stale cached residual costs
them little and says nothing about what a cache costs a real run. This script trains pairs of tiny Wan2.2
experts (head width 128 like the real ones) by flow matching in ComfyUI's convention for Wan
(`x = s * noise + (1 - s) * x0`, target `noise - x0`, timestep `1000 * s`): the high-noise expert on
s >= 0.875, the low-noise expert below. Their data is made here, in the latent space the transformer sees
(after Wan21.process_in): 16 channels, a few latent frames, one object moving 2 latent pixels a frame over a
background. The shape and the direction are the class (8 classes), and each class is a fixed sequence of
umt5-shaped tokens (4096 wide, zero-padded to ComfyUI's 512 rows), so the conditioning matters; a tenth of the
training samples use the negative prompt instead (CFG dropout).

There are several beds (BEDS), made to differ where real models differ: depth, heads, the data (objects,
motions, a textured background, a camera pan), the latent sizes trained at (one bed at three, so calibrating
small and running large can be measured) and the training's length. One of them, `tuning`, is the only one the
pack's defaults, advice and constants are chosen on; the others are held out and only report. The family's beds
(FAMILY) are other Wan2.2 models: `vace` is a VACE-Fun pair (diffusers' WanVACETransformer3DModel, VACE blocks
after every other main block) trained to put the object where a control puts it: the object's track as the
control's reactive frames, the mask all ones, as WanVaceToVideo hands a tracking video to ComfyUI's VaceWanModel;
`ti2v` is a TI2V-5B stand-in: one transformer over every noise level on a 48-channel latent.

Training is deterministic for a config (one thread per expert, the two experts in two processes). It stops when
the validation loss has not improved for `patience` evaluations, or at `max_steps`, and keeps the best
evaluated weights. Each bed is built once per machine into a cache outside the clone
(~/.cache/wan22-cachedit/testbed/<key>/<bed>, or $WAN22_TESTBED_CACHE), keyed by this script's content: change
the script and the next build trains anew. Its log (bed.json) has the training time, the losses, each file's
SHA-256, whether it is the tuning bed or held out, and what it generates through ComfyUI's own
two-KSamplerAdvanced graph: how well each sample fits the nearest data template (relative L2: clean data about
0.05, noise 1.0) and whether its class is the one asked for, at each size it was trained at; on a VACE bed, how
well it follows the control (World.track_fidelity: 1 on the track, 0 no closer than chance).

They are tiny and synthetic: they say how a cache's error behaves on models that denoise, not how a real
Wan2.2 video looks.

    .venv/bin/python -m devtools.testbed [--bed tuning deep wide vace ti2v] [--force] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
BOUNDARY = 0.875  # Wan2.2 T2V: the high-noise expert at s >= 0.875
CHANNELS = 16  # the latent the transformer sees: 16 channels; tuning bed 3 x 12 x 12 (a 96 x 96 x 9 video)
SINGLE, SINGLE_CHANNELS = "single", 48  # TI2V-5B: one transformer ("single") on the Wan2.2 VAE's 48 channels
FRAMES, SIZE = 3, 12
TEXT_ROWS, TEXT_WIDTH = 512, 4096  # umt5's output: 512 rows, zero past the prompt's tokens
PROMPT_TOKENS, NEGATIVE_TOKENS = 12, 3
DIRECTIONS = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0),  # (dy, dx) per frame, x2 pixels
              "down-right": (1, 1), "up-left": (-1, -1), "down-left": (1, -1), "up-right": (-1, 1)}
PANS = ((0, 0), (0, 1), (0, -1), (1, 0), (-1, 0))  # a camera pan: the background moves a pixel a frame
STEP_PIXELS = 2
MARGIN = 2  # the object's centre stays this far from the edges


@dataclass(frozen=True)
class BedConfig:
    """What is trained, on what data, and how long at most. Tests train a quick one."""

    num_layers: int = 8
    dim: int = 256  # heads x 128
    ffn_dim: int = 512
    seed: int = 0
    batch: int = 12
    lr: float = 5e-4
    warmup_steps: int = 50
    max_steps: int = 1100  # about 1.0 CPU-seconds a step: 20 minutes for the two experts on two cores
    eval_every: int = 50
    patience: int = 5  # evaluations without a 0.5 % improvement before training stops
    validation: int = 96  # validation samples (fixed noise and s)
    cfg_dropout: float = 0.1
    # the data world
    shapes: tuple = ("blob", "gabor")
    directions: tuple = ("right", "left", "down", "up")
    texture: float = 0.0  # the amplitude of a fixed background texture (0: a smooth background)
    pan: bool = False  # the background pans a pixel a frame in a random direction (a camera pan), or stands
    sizes: tuple = ((FRAMES, SIZE),)  # (latent frames, height = width) trained at; the last is the one measured
    # VACE-Fun: the main blocks after which a VACE block's hint is added (ComfyUI maps VACE block k after main block
    # k * layers / VACE blocks), and the control it is trained with: the object's track (VACE_CHANNELS). () : none
    vace_layers: tuple = ()
    # TI2V-5B: one transformer over every noise level (no boundary, no second expert), on the Wan2.2 VAE's latent
    channels: int = CHANNELS

    @classmethod
    def from_dict(cls, values: dict) -> "BedConfig":
        """A config back from its JSON (lists become the tuples they were)."""
        fixed = {k: tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(value, list)
                 else value for k, value in values.items()}
        return cls(**fixed)

    @property
    def heads(self) -> int:
        return self.dim // 128

    @property
    def vace(self) -> bool:
        return bool(self.vace_layers)

    @property
    def single(self) -> bool:
        """One transformer (TI2V-5B: 48 channels) rather than two experts."""
        return self.channels == SINGLE_CHANNELS

    @property
    def roles(self) -> tuple[str, ...]:
        return (SINGLE,) if self.single else ("high", "low")

    @property
    def measured(self) -> tuple[int, int]:
        return tuple(self.sizes[-1])

    def latent(self, size: tuple[int, int] | None = None) -> tuple[int, ...]:
        """The latent ComfyUI samples for a size of this bed (the measured one by default): (1, C, F, H, W)."""
        frames, side = size or self.measured
        return (1, self.channels, frames, side, side)


# The beds. `tuning` alone chooses the pack's defaults, advice and constants; the others are held out and only
# report. They differ where real models differ: depth, heads, the data (objects, motions, texture, a camera pan),
# the latent sizes trained at and the training's length. Each builds in at most about 30 minutes on two cores.
TUNING = "tuning"
BEDS = {
    TUNING: BedConfig(),
    "deep": BedConfig(num_layers=16, batch=8, lr=4e-4, max_steps=1400, seed=1, shapes=("ring", "square"),
                      directions=("down-right", "up-left", "down-left", "up-right"), texture=0.6),
    "wide": BedConfig(num_layers=10, dim=384, ffn_dim=512, batch=8, max_steps=1000, seed=2, shapes=("blob", "ring"),
                      texture=0.6, pan=True, sizes=((2, 8), (3, 12), (4, 16))),
}
ROLES = {name: "tuning" if name == TUNING else "held-out" for name in BEDS}
# The beds of the Wan2.2 family's other models, measured by bench/family.py (not by the cache-versus-peers suite):
# VACE-Fun (the tuning bed's world and size, VACE blocks after every other main block, trained to follow the
# object's track given as control frames) and TI2V-5B (one transformer over every noise level, 48 channels).
FAMILY = {
    "vace": BedConfig(num_layers=8, seed=3, max_steps=1000, shapes=("blob", "square"), vace_layers=(0, 2, 4, 6)),
    "ti2v": BedConfig(num_layers=8, seed=4, max_steps=1000, shapes=("blob", "ring"), channels=SINGLE_CHANNELS),
}
ROLES.update({name: "family" for name in FAMILY})
VACE_CHANNELS = 96  # VACE's control: 16 inactive + 16 reactive latent channels, then the 64 channels of the mask
QUICK = BedConfig(num_layers=2, ffn_dim=256, batch=4, max_steps=6, eval_every=3, warmup_steps=2, validation=8)
QUICKS = {"quick": QUICK, "quick_vace": dataclasses.replace(QUICK, vace_layers=(0, 1)),  # smoke tests' beds
          "quick_ti2v": dataclasses.replace(QUICK, channels=SINGLE_CHANNELS)}


# --- the data world: templates, conditioning, fitting ---

class World:
    """Everything about the data that is fixed by the config's seed: the channel loadings of object, background
    and texture, the texture itself, the class prompts and the negative. Data and fits are made from it. A class
    is a shape and a direction; a sample is one object of its class moving over the frames, at a random start
    and amplitude, over a background (offset and gradients, random; a texture, panned or not)."""

    def __init__(self, config: BedConfig = BedConfig()):
        self.config = config
        self.classes = [f"{shape} {direction}" for shape in config.shapes for direction in config.directions]
        g = torch.Generator().manual_seed(10_000 + config.seed)
        self.object_vector = F.normalize(torch.randn(config.channels, generator=g), dim=0) * 4.0
        self.background_vector = F.normalize(torch.randn(config.channels, generator=g), dim=0) * 4.0
        self.prompts = torch.randn(len(self.classes), PROMPT_TOKENS, TEXT_WIDTH, generator=g)
        self.negative = torch.randn(NEGATIVE_TOKENS, TEXT_WIDTH, generator=g)
        self.pans = PANS if config.pan else PANS[:1]
        if config.texture:  # drawn after the rest: a world without texture draws what it always drew
            self.texture_vector = F.normalize(torch.randn(config.channels, generator=g), dim=0) * 4.0
            reach = max(side for _f, side in config.sizes) + 2 * max(frames for frames, _s in config.sizes)
            field = torch.randn(1, 1, reach, reach, generator=g)
            kernel = torch.exp(-torch.arange(-4, 5, dtype=torch.float32) ** 2 / (2 * 1.2 ** 2))
            kernel = (kernel[:, None] * kernel[None, :] / kernel.sum() ** 2)[None, None]
            field = F.conv2d(F.pad(field, (4, 4, 4, 4), mode="reflect"), kernel)[0, 0]
            self.texture = (field - field.mean()) / field.std()
        self._starts: dict = {}

    def grid(self, side: int) -> tuple[torch.Tensor, torch.Tensor]:
        ys, xs = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32),
                                indexing="ij")
        return ys, xs

    def starts(self, cls: int, frames: int = FRAMES, side: int = SIZE) -> list[tuple[int, int]]:
        """Every start (y, x) of class `cls` whose path stays inside the frame's margins."""
        key = (cls, frames, side)
        if key not in self._starts:
            dy, dx = DIRECTIONS[self.classes[cls].split()[1]]
            travel = STEP_PIXELS * (frames - 1)
            self._starts[key] = [(y, x) for y in range(MARGIN, side - MARGIN) for x in range(MARGIN, side - MARGIN)
                                 if MARGIN <= y + dy * travel < side - MARGIN
                                 and MARGIN <= x + dx * travel < side - MARGIN]
        return self._starts[key]

    def pattern(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE) -> torch.Tensor:
        """The object of class `cls` starting at (y, x), over the frames: (frames, side, side)."""
        shape, direction = self.classes[cls].split()
        dy, dx = DIRECTIONS[direction]
        ys, xs = self.grid(side)
        out = []
        for t in range(frames):
            cy, cx = y + dy * STEP_PIXELS * t, x + dx * STEP_PIXELS * t
            r2 = (ys - cy) ** 2 + (xs - cx) ** 2
            if shape == "blob":
                out.append(torch.exp(-r2 / (2 * 1.5 ** 2)))
            elif shape == "gabor":
                out.append(torch.exp(-r2 / (2 * 2.0 ** 2)) * torch.cos(2 * math.pi * (xs - cx) / 3.0))
            elif shape == "ring":
                out.append(torch.exp(-(r2.sqrt() - 2.2) ** 2 / (2 * 0.7 ** 2)))
            elif shape == "square":
                out.append(torch.sigmoid((2.0 - (ys - cy).abs()) / 0.4) * torch.sigmoid((2.0 - (xs - cx).abs()) / 0.4))
            else:
                raise ValueError(f"unknown shape {shape!r}")
        return torch.stack(out)

    def textured(self, pan: int, frames: int, side: int) -> torch.Tensor:
        """The texture as the frames see it under pan `pan` (an index of PANS): (frames, side, side)."""
        (py, px), o = PANS[pan], frames
        return torch.stack([self.texture[o + py * t:o + py * t + side, o + px * t:o + px * t + side]
                            for t in range(frames)])

    def basis(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE, pan: int = 0) -> torch.Tensor:
        """The latents a template of this class, start and pan is a sum of: (k, C, F, H, W): the object, the
        background's offset, x gradient and y gradient, and the texture if the world has one."""
        obj = self.object_vector[:, None, None, None] * self.pattern(cls, y, x, frames, side)[None]
        ys, xs = self.grid(side)
        planes = [torch.ones(side, side), (xs - (side - 1) / 2) / side, (ys - (side - 1) / 2) / side]
        bg = [self.background_vector[:, None, None, None] * p.expand(frames, side, side)[None] for p in planes]
        if self.config.texture:
            bg.append(self.texture_vector[:, None, None, None] * self.textured(pan, frames, side)[None])
        return torch.stack([obj, *bg])

    def control(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE) -> torch.Tensor:
        """VACE's control for the object of class `cls` starting at (y, x), in the space the transformer sees:
        (VACE_CHANNELS, F, H, W): nothing inactive, the object's track at unit amplitude as the reactive frames (what
        a tracking control video encodes to), and the mask all ones (every pixel under control)."""
        track = self.object_vector[:, None, None, None] * self.pattern(cls, y, x, frames, side)[None]
        return torch.cat([torch.zeros_like(track), track, torch.ones(VACE_CHANNELS - 2 * CHANNELS, frames, side, side)])

    def sample(self, n: int, g: torch.Generator, size: tuple[int, int] | None = None, controls: bool = False
               ) -> tuple[torch.Tensor, ...]:
        """n clean latents (n, C, F, H, W) and their classes: a random class, start, amplitude and background
        (and texture amplitude and pan), plus a little noise (what keeps clean data at a fit of about 0.05); with
        `controls`, each sample's VACE control as a third (n, VACE_CHANNELS, F, H, W), drawing nothing more."""
        frames, side = size or self.config.sizes[0]
        classes = torch.randint(0, len(self.classes), (n,), generator=g)
        out, tracks = [], []
        for c in classes.tolist():
            starts = self.starts(c, frames, side)
            y, x = starts[int(torch.randint(0, len(starts), (1,), generator=g))]
            if controls:
                tracks.append(self.control(c, y, x, frames, side))
            coeffs = [0.5 + 0.5 * float(torch.rand(1, generator=g)), 0.3 * float(torch.randn(1, generator=g)),
                      0.6 * float(torch.randn(1, generator=g)), 0.6 * float(torch.randn(1, generator=g))]
            pan = 0
            if self.config.texture:
                coeffs.append(self.config.texture * float(torch.randn(1, generator=g)))
                if self.config.pan:
                    pan = int(torch.randint(0, len(PANS), (1,), generator=g))
            basis = self.basis(c, y, x, frames, side, pan)
            latent = (torch.tensor(coeffs)[:, None, None, None, None] * basis).sum(0)
            out.append(latent + 0.02 * torch.randn(latent.shape, generator=g))
        if controls:
            return torch.stack(out), classes, torch.stack(tracks)
        return torch.stack(out), classes

    def chance_distance(self, cls: int, frames: int = FRAMES, side: int = SIZE) -> float:
        """How far apart two starts of class `cls` are on average (latent pixels): where an object lands when the
        control is ignored, against where the control puts it."""
        starts = torch.tensor(self.starts(cls, frames, side), dtype=torch.float64)
        return float(torch.cdist(starts, starts).mean())

    def track_fidelity(self, fit: dict, cls: int, start: tuple[int, int], frames: int = FRAMES,
                       side: int = SIZE) -> dict:
        """How well an output (its `fit`) follows a VACE control that puts the object of class `cls` at `start`:
        the distance of the fitted start from it, and the fidelity 1 - distance / chance_distance (1: on the
        track; 0: no closer than chance)."""
        distance = math.dist(fit["start"], start)
        return {"track_distance": distance, "fidelity": 1 - distance / self.chance_distance(cls, frames, side)}

    def context(self, cls: int | None) -> torch.Tensor:
        """A prompt's text embedding as ComfyUI hands it to the model: (1, 512, 4096), zero past its tokens.
        None: the negative prompt."""
        tokens = self.negative if cls is None else self.prompts[cls]
        out = torch.zeros(1, TEXT_ROWS, TEXT_WIDTH)
        out[0, :len(tokens)] = tokens
        return out

    def fit(self, latent: torch.Tensor) -> dict:
        """The nearest data template to a latent (C, F, H, W): for every class, start (and pan), the least-squares
        amplitude and background; returns its relative L2 to the latent and its class."""
        frames, side = latent.shape[1], latent.shape[3]
        target = latent.reshape(-1).double()
        best = None
        for c in range(len(self.classes)):
            places = [(y, x, pan) for y, x in self.starts(c, frames, side) for pan in range(len(self.pans))]
            bases = torch.stack([self.basis(c, y, x, frames, side, pan).reshape(-1, target.numel())
                                 for y, x, pan in places]).double()
            gram = bases @ bases.transpose(1, 2)
            rhs = bases @ target
            coeffs = torch.linalg.solve(gram, rhs)
            residual = target - (coeffs[:, :, None] * bases).sum(1)
            errors = residual.norm(dim=1) / target.norm()
            i = int(errors.argmin())
            if best is None or errors[i] < best[0]:
                best = (float(errors[i]), c, places[i])
        return {"rel_l2": best[0], "class": best[1], "start": list(best[2][:2]), "pan": best[2][2]}


# --- training ---

def model_config(config: BedConfig) -> dict:
    from devtools.tiny_wan import tiny_config

    out = tiny_config("ti2v" if config.single else "t2v", num_layers=config.num_layers, dim=config.dim,
                      ffn_dim=config.ffn_dim)
    if config.vace:
        out.update(vace_layers=list(config.vace_layers), vace_in_channels=VACE_CHANNELS)
    return out


def transformer_class(config: BedConfig):
    """diffusers' Wan transformer, or its VACE one (whose hints are added after config.vace_layers)."""
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    return WanVACETransformer3DModel if config.vace else WanTransformer3DModel


class ShortContextAttention:
    """Cross-attention over the prompt's token slots plus one zero row standing for all the zero rows of
    ComfyUI's 512: zero rows give identical keys and values, so attending to n of them equals attending to one
    with log(n) added to its logit (exact, and 40 times cheaper in the text embedding). Training only: the
    saved experts are sampled with the real 512 rows."""

    def __init__(self, zero_rows: int):
        self.bias = math.log(zero_rows)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        key = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        value = attn.to_v(encoder_hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        mask = torch.zeros(1, key.shape[2], dtype=query.dtype)
        mask[0, -1] = self.bias
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def short_contexts(world: World, classes: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """(n, PROMPT_TOKENS + 1, 4096): each sample's token slots (a class prompt, or the negative's tokens then
    zeros) and the zero row that stands for the rest of the 512."""
    out = torch.zeros(len(classes), PROMPT_TOKENS + 1, TEXT_WIDTH)
    for i, (c, neg) in enumerate(zip(classes.tolist(), negative.tolist())):
        tokens = world.negative if neg else world.prompts[c]
        out[i, :len(tokens)] = tokens
    return out


def draw_s(role: str, n: int, g: torch.Generator) -> torch.Tensor:
    """Noise levels for an expert: high U[0.875, 1]; low in [0, 0.875), half uniform, half where a shift-8
    schedule visits; one transformer (SINGLE) likewise over [0, 1)."""
    u = torch.rand(n, generator=g)
    if role == "high":
        return BOUNDARY + (1 - BOUNDARY) * u
    if role == SINGLE:
        pick = torch.rand(n, generator=g) < 0.5
        return torch.where(pick, u, 8 * u / (1 + 7 * u)).clamp(max=1 - 1e-4)
    shifted = 8 * u / (1 + 7 * u) * BOUNDARY
    uniform = u * BOUNDARY
    pick = torch.rand(n, generator=g) < 0.5
    return torch.where(pick, uniform, shifted).clamp(max=BOUNDARY - 1e-4)


def flow_batch(world: World, role: str, n: int, g: torch.Generator, dropout: float,
               size: tuple[int, int] | None = None):
    """One batch in ComfyUI's convention: (x_s, timestep 1000 s, short contexts, target noise - x0, and for a
    VACE bed each sample's control, else None)."""
    x0, classes, *controls = world.sample(n, g, size, controls=world.config.vace)
    negative = torch.rand(n, generator=g) < dropout
    s = draw_s(role, n, g)
    noise = torch.randn(x0.shape, generator=g)
    x = s[:, None, None, None, None] * noise + (1 - s[:, None, None, None, None]) * x0
    return x, 1000 * s, short_contexts(world, classes, negative), noise - x0, (controls or [None])[0]


def predict(model, x, t, ctx, control):
    """The model's prediction, with the batch's VACE control where the bed has one."""
    if control is None:
        return model(x, t, ctx, return_dict=False)[0]
    return model(x, t, ctx, control_hidden_states=control, return_dict=False)[0]


def train_expert(role: str, config: BedConfig, log=print) -> tuple[dict, dict]:
    """Trains one expert (one thread, deterministic for config.seed); returns (its best state dict in
    diffusers' names, its training log)."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed * 100 + (1 if role == "high" else 2))
    model = transformer_class(config)(**model_config(config))
    processor = ShortContextAttention(TEXT_ROWS - PROMPT_TOKENS)
    for block in [*model.blocks, *getattr(model, "vace_blocks", ())]:
        block.attn2.set_processor(processor)
    world = World(config)
    g_val = torch.Generator().manual_seed(config.seed * 100 + 50 + (1 if role == "high" else 2))
    sizes = config.sizes  # trained in turn, a batch of one size each step; validated on each alike
    validations = [flow_batch(world, role, config.validation // len(sizes), g_val, config.cfg_dropout, size)
                   for size in sizes]
    g = torch.Generator().manual_seed(config.seed * 100 + (11 if role == "high" else 12))
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)

    def lr_at(step):
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    def validate():
        model.eval()
        per_size = []
        with torch.no_grad():
            for validation in validations:
                losses = []
                for i in range(0, len(validation[0]), 16):
                    x, t, ctx, v, control = (None if part is None else part[i:i + 16] for part in validation)
                    losses.append(F.mse_loss(predict(model, x, t, ctx, control), v, reduction="sum"))
                per_size.append(float(sum(losses) / validation[0].numel()))
        model.train()
        return sum(per_size) / len(per_size)

    started = time.perf_counter()
    history = [{"step": 0, "validation": validate()}]
    best = (history[0]["validation"], 0, {k: v.clone() for k, v in model.state_dict().items()})
    stale, step, train_losses = 0, 0, []
    model.train()
    while step < config.max_steps:
        x, t, ctx, v, control = flow_batch(world, role, config.batch, g, config.cfg_dropout, sizes[step % len(sizes)])
        loss = F.mse_loss(predict(model, x, t, ctx, control), v)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        train_losses.append(float(loss))
        if step % config.eval_every == 0 or step == config.max_steps:
            val = validate()
            history.append({"step": step, "validation": val,
                            "train": sum(train_losses[-config.eval_every:]) / len(train_losses[-config.eval_every:])})
            log(f"[testbed] {role} step {step}: validation {val:.4f} ({time.perf_counter() - started:.0f} s)")
            if val < best[0] * 0.995:
                best, stale = (val, step, {k: v.clone() for k, v in model.state_dict().items()}), 0
            else:
                stale += 1
                if stale >= config.patience:
                    break
    return best[2], {"role": role, "steps": step, "best_step": best[1], "best_validation": best[0],
                     "first_validation": history[0]["validation"], "history": history,
                     "stopped": "plateau" if step < config.max_steps else "max_steps",
                     "seconds": round(time.perf_counter() - started, 1)}


def expert_model(config: BedConfig, state_dict: dict):
    """The trained expert as a diffusers model (the default attention: what ComfyUI's loader then reads)."""
    model = transformer_class(config)(**model_config(config))
    model.load_state_dict(state_dict)
    return model.eval().requires_grad_(False)


# --- the cache of built beds ---

def script_key(path: str = SCRIPT) -> str:
    """The beds' cache key: this script's content (any change trains every bed anew)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def cache_root() -> str:
    return os.environ.get("WAN22_TESTBED_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "wan22-cachedit",
                                                                  "testbed")


def bed_folder(name: str = TUNING, key: str | None = None) -> str:
    """Where bed `name` of this script (or of `key`) is cached."""
    return os.path.join(cache_root(), key or script_key(), name)


def config_of(name: str) -> BedConfig:
    if name in QUICKS:
        return QUICKS[name]
    if name not in BEDS and name not in FAMILY:
        raise SystemExit(f"unknown bed {name!r}: the beds are {', '.join([*BEDS, *FAMILY])} (and quick, a smoke "
                         "test)")
    return BEDS.get(name) or FAMILY[name]


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bed:
    """A built bed: its name, its folder, the two experts' files and its log."""

    folder: str
    log: dict

    @property
    def name(self) -> str:
        return self.log["name"]

    @property
    def config(self) -> BedConfig:
        return BedConfig.from_dict(self.log["config"])

    @property
    def role(self) -> str:
        return self.log["role"]

    @property
    def files(self) -> dict:
        return {role: os.path.join(self.folder, f"{role}.safetensors") for role in self.config.roles}


def load_bed(folder: str) -> Bed | None:
    path = os.path.join(folder, "bed.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return Bed(folder, json.load(f))


def build(name: str = TUNING, force: bool = False, folder: str | None = None, log=print) -> Bed:
    """Bed `name`, from the cache when this script built it on this machine before, else trained now (the two
    experts side by side, one process and one thread each), written (training.json), then evaluated through
    ComfyUI (bed.json). Trained experts whose evaluation did not finish are evaluated, not trained again."""
    config = config_of(name)
    folder = folder or bed_folder(name)
    if not force and (bed := load_bed(folder)) is not None:
        return bed
    os.makedirs(folder, exist_ok=True)
    trained = os.path.join(folder, "training.json")
    if force or not os.path.exists(trained):
        log(f"[testbed] training bed {name!r} ({config.num_layers} layers, {config.heads} heads, "
            f"at most {config.max_steps} steps): {folder}")
        bed_log = train_both(config, folder)
        bed_log.update(name=name, role="quick" if name.startswith("quick") else ROLES[name])
        with open(trained, "w", encoding="utf-8") as f:
            json.dump(bed_log, f, indent=2)
    with open(trained, encoding="utf-8") as f:
        bed_log = json.load(f)
    bed = Bed(folder, bed_log)
    bed_log["generation"] = evaluate(bed, log=log)
    with open(os.path.join(folder, "bed.json"), "w", encoding="utf-8") as f:
        json.dump(bed_log, f, indent=2)
    log(f"[testbed] bed {name!r} built in {bed_log['training_wall_s']:.0f} s of training: {folder}")
    return bed


def train_both(config: BedConfig, folder: str) -> dict:
    """Trains the two experts in two processes of one thread each (a single transformer in one) and writes them as
    ComfyUI single files."""
    from devtools.tiny_wan import write_single_file

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wan22-testbed-") as tmp:
        procs = {}
        for role in config.roles:
            out = os.path.join(tmp, role)
            procs[role] = subprocess.Popen([sys.executable, "-m", "devtools.testbed", "--train-one", role, "--out", out,
                                            "--config", json.dumps(asdict(config))], cwd=ROOT)
        for role, proc in procs.items():
            if proc.wait() != 0:
                raise RuntimeError(f"training the {role}-noise expert failed (exit {proc.returncode})")
        training = {}
        for role in config.roles:
            state = torch.load(os.path.join(tmp, role, "weights.pt"))
            with open(os.path.join(tmp, role, "log.json"), encoding="utf-8") as f:
                training[role] = json.load(f)
            write_single_file(expert_model(config, state), os.path.join(folder, f"{role}.safetensors"), "fp32")
    return {"key": os.path.basename(os.path.dirname(folder)), "config": asdict(config),
            "classes": World(config).classes, "training_wall_s": round(time.perf_counter() - started, 1),
            "training": training,
            "sha256": {role: sha256_of(os.path.join(folder, f"{role}.safetensors")) for role in config.roles},
            "torch": torch.__version__, "built": time.strftime("%Y-%m-%d %H:%M:%S")}


# --- what the bed generates, through ComfyUI's own graph ---

GENERATION_RUN = {"sampler": "uni_pc", "scheduler": "simple", "steps": 20, "flow_shift": 8.0,
                  "cfg": {"high": 4.0, "low": 4.0}}


def evaluate(bed: Bed, log=print, samples: int = 8) -> dict:
    """At each size the bed was trained at, samples one latent per class (seeds 1..8) through ComfyUI's
    two-KSamplerAdvanced graph at CFG 4 and fits each to the nearest data template: the fit (relative L2), the
    class it shows, and clean data's fit beside it. The measured size's figures lead."""
    from devtools.bed_runs import BedRuns

    config = bed.config
    world = World(config)
    per_size = {}
    with tempfile.TemporaryDirectory(prefix="wan22-testbed-eval-") as base:
        runs = BedRuns(base, bed, world)
        for size in config.sizes:
            fits = []
            for i in range(samples):
                cls = i % len(world.classes)
                start = control_start(world, i, cls, size) if config.vace else None
                control = None if start is None else world.control(cls, *start, *size)
                latent = runs.run(GENERATION_RUN, seed=i + 1, cls=cls, size=size, control=control)
                fit = world.fit(runs.model_space(latent)[0])
                fits.append({"seed": i + 1, "class": cls, **fit, "right": fit["class"] == cls})
                if start is not None:
                    fits[-1].update(control_start=list(start), **world.track_fidelity(fit, cls, start, *size))
            clean, _ = world.sample(samples, torch.Generator().manual_seed(7), size)
            clean_fits = [world.fit(x)["rel_l2"] for x in clean]
            per_size["x".join(map(str, size))] = {
                "samples": fits, "template_fit_mean": sum(f["rel_l2"] for f in fits) / len(fits),
                "template_fit_max": max(f["rel_l2"] for f in fits),
                "class_right": sum(f["right"] for f in fits), "of": len(fits),
                "clean_data_fit_mean": sum(clean_fits) / len(clean_fits)}
            if config.vace:
                per_size["x".join(map(str, size))]["fidelity_mean"] = sum(f["fidelity"] for f in fits) / len(fits)
    measured = per_size["x".join(map(str, config.measured))]
    out = {"run": GENERATION_RUN, "size": list(config.measured), **measured}
    if len(per_size) > 1:
        out["sizes"] = {size: {k: v for k, v in figures.items() if k != "samples"}
                        for size, figures in per_size.items()}
    vace = f", the control's track followed at {out['fidelity_mean']:.2f} (fidelity)" if config.vace else ""
    log(f"[testbed] {bed.name}: samples fit a template at {out['template_fit_mean']:.3f} (mean; clean data "
        f"{out['clean_data_fit_mean']:.3f}), class right in {out['class_right']} of {out['of']}{vace}")
    return out


def control_start(world: World, i: int, cls: int, size: tuple[int, int]) -> tuple[int, int]:
    """The start a VACE control puts sample `i` of class `cls` at: spread over the class's starts, fixed."""
    starts = world.starts(cls, *size)
    return starts[(7 * i + 3) % len(starts)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bed", nargs="+", default=list(BEDS),
                        help=f"the beds to build (default: {', '.join(BEDS)}; the family's: {', '.join(FAMILY)}; "
                             "quick: a smoke test)")
    parser.add_argument("--force", action="store_true", help="train again even if the cache has the bed")
    parser.add_argument("--quick", action="store_true", help="a tiny, barely trained bed (a smoke test)")
    parser.add_argument("--train-one", choices=("high", "low", SINGLE), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_one:  # a child of build(): one expert, one thread
        config = BedConfig.from_dict(json.loads(args.config))
        state, log = train_expert(args.train_one, config)
        os.makedirs(args.out, exist_ok=True)
        torch.save(state, os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "log.json"), "w", encoding="utf-8") as f:
            json.dump(log, f)
        return 0
    for name in (["quick"] if args.quick else args.bed):
        bed = build(name, force=args.force)
        print(json.dumps({k: v for k, v in bed.log.items() if k != "training"}, indent=2))
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    raise SystemExit(main())
