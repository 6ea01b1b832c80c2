"""The test beds' data world and what a bed is: its config (BedConfig) and the World its seed fixes.

Data is made here, in the latent space the transformer sees (after Wan21.process_in): 16 channels, a few latent
frames, one object (or several of one class) moving 2 latent pixels a frame (or another speed) over a background.
The shape and the direction are the class (8 classes), and each class is a fixed sequence of umt5-shaped tokens
(4096 wide, zero-padded to ComfyUI's 512 rows), so the conditioning matters; in a world with a palette each class
also has its own object colour (channel loading), so the prompt shows wherever the object is. This module and
train.py decide a bed's weights: together they are the beds' cache key (build.py), so a change here trains every
bed anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

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
ANCHOR_REACH = 1  # an anchored class's starts: within this many latent pixels (each way) of its anchor
VACE_CHANNELS = 96  # VACE's control: 16 inactive + 16 reactive latent channels, then the 64 channels of the mask


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
    # Added after the beds above were built; their defaults draw what those beds always drew.
    palette: bool = False  # each class its own object colour: a zero-mean simplex, so CFG's negative shows none
    objects: int = 1  # objects of the sample's class, each at its own start and amplitude
    speed: int = STEP_PIXELS  # latent pixels an object moves a frame
    texture_scale: float = 1.2  # the texture's smoothing (a Gaussian's sigma, latent pixels)
    anchored: bool = False  # each class's objects start within anchor_reach of a start of its own, not anywhere
    anchor_reach: int = ANCHOR_REACH  # anchored: 0 puts each class's object at one start (the prompt fixes its path)

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


class World:
    """Everything about the data that is fixed by the config's seed: the channel loadings of object, background
    and texture, the texture itself, the class prompts and the negative. Data and fits are made from it. A class
    is a shape and a direction; a sample is one object of its class moving over the frames, at a random start
    and amplitude, over a background (offset and gradients, random; a texture, panned or not). With `objects` > 1 a
    sample has that many objects of its class; with a palette each class's object has its own colour; anchored,
    each class's objects start near a place of its own."""

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
            kernel = torch.exp(-torch.arange(-4, 5, dtype=torch.float32) ** 2 / (2 * config.texture_scale ** 2))
            kernel = (kernel[:, None] * kernel[None, :] / kernel.sum() ** 2)[None, None]
            field = F.conv2d(F.pad(field, (4, 4, 4, 4), mode="reflect"), kernel)[0, 0]
            self.texture = (field - field.mean()) / field.std()
        self.palette = None
        if config.palette:  # drawn after the rest too: orthonormal loadings, centred (their mean is exactly zero)
            basis, _ = torch.linalg.qr(torch.randn(config.channels, len(self.classes), generator=g))
            centred = basis - basis.mean(dim=1, keepdim=True)
            self.palette = F.normalize(centred.T, dim=1) * 4.0  # (classes, channels)
        # anchored: where among its starts each class's anchor lies (a share of the list, so any size has one)
        self.anchors = torch.rand(len(self.classes), generator=g).tolist() if config.anchored else None
        self._starts: dict = {}

    def colour(self, cls: int) -> torch.Tensor:
        """The channel loading of class `cls`'s object: the class's own in a world with a palette."""
        return self.object_vector if self.palette is None else self.palette[cls]

    def grid(self, side: int) -> tuple[torch.Tensor, torch.Tensor]:
        ys, xs = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32),
                                indexing="ij")
        return ys, xs

    def starts(self, cls: int, frames: int = FRAMES, side: int = SIZE) -> list[tuple[int, int]]:
        """Every start (y, x) of class `cls` whose path stays inside the frame's margins (in an anchored world, those
        around the class's anchor)."""
        key = (cls, frames, side)
        if key not in self._starts:
            dy, dx = DIRECTIONS[self.classes[cls].split()[1]]
            travel = self.config.speed * (frames - 1)
            starts = [(y, x) for y in range(MARGIN, side - MARGIN) for x in range(MARGIN, side - MARGIN)
                      if MARGIN <= y + dy * travel < side - MARGIN and MARGIN <= x + dx * travel < side - MARGIN]
            if self.anchors is not None:  # the class's anchor and the starts around it
                ay, ax = starts[int(self.anchors[cls] * len(starts))]
                reach = self.config.anchor_reach
                starts = [(y, x) for y, x in starts if abs(y - ay) <= reach and abs(x - ax) <= reach]
            self._starts[key] = starts
        return self._starts[key]

    def pattern(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE) -> torch.Tensor:
        """The object of class `cls` starting at (y, x), over the frames: (frames, side, side)."""
        shape, direction = self.classes[cls].split()
        dy, dx = DIRECTIONS[direction]
        ys, xs = self.grid(side)
        out = []
        for t in range(frames):
            cy, cx = y + dy * self.config.speed * t, x + dx * self.config.speed * t
            r2 = (ys - cy) ** 2 + (xs - cx) ** 2
            ay, ax = (ys - cy).abs(), (xs - cx).abs()
            if shape == "blob":
                out.append(torch.exp(-r2 / (2 * 1.5 ** 2)))
            elif shape == "gabor":
                out.append(torch.exp(-r2 / (2 * 2.0 ** 2)) * torch.cos(2 * math.pi * (xs - cx) / 3.0))
            elif shape == "ring":
                out.append(torch.exp(-(r2.sqrt() - 2.2) ** 2 / (2 * 0.7 ** 2)))
            elif shape == "square":
                out.append(torch.sigmoid((2.0 - ay) / 0.4) * torch.sigmoid((2.0 - ax) / 0.4))
            elif shape == "cross":
                out.append(torch.maximum(torch.exp(-ay ** 2 / (2 * 0.7 ** 2) - ax ** 2 / (2 * 2.2 ** 2)),
                                         torch.exp(-ax ** 2 / (2 * 0.7 ** 2) - ay ** 2 / (2 * 2.2 ** 2))))
            elif shape == "dot":
                out.append(torch.exp(-r2 / (2 * 0.9 ** 2)))
            elif shape == "bar":
                out.append(torch.sigmoid((2.6 - ax) / 0.4) * torch.sigmoid((0.9 - ay) / 0.4))
            else:
                raise ValueError(f"unknown shape {shape!r}")
        return torch.stack(out)

    def textured(self, pan: int, frames: int, side: int) -> torch.Tensor:
        """The texture as the frames see it under pan `pan` (an index of PANS): (frames, side, side)."""
        (py, px), o = PANS[pan], frames
        return torch.stack([self.texture[o + py * t:o + py * t + side, o + px * t:o + px * t + side]
                            for t in range(frames)])

    def basis(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE, pan: int = 0,
              more: tuple = ()) -> torch.Tensor:
        """The latents a template of this class, start and pan is a sum of: (k, C, F, H, W): the object (then one
        more object of the class at each start of `more`), the background's offset, x gradient and y gradient, and
        the texture if the world has one."""
        objects = [self.colour(cls)[:, None, None, None] * self.pattern(cls, oy, ox, frames, side)[None]
                   for oy, ox in ((y, x), *more)]
        ys, xs = self.grid(side)
        planes = [torch.ones(side, side), (xs - (side - 1) / 2) / side, (ys - (side - 1) / 2) / side]
        bg = [self.background_vector[:, None, None, None] * p.expand(frames, side, side)[None] for p in planes]
        if self.config.texture:
            bg.append(self.texture_vector[:, None, None, None] * self.textured(pan, frames, side)[None])
        return torch.stack([*objects, *bg])

    def control(self, cls: int, y: int, x: int, frames: int = FRAMES, side: int = SIZE) -> torch.Tensor:
        """VACE's control for the object of class `cls` starting at (y, x), in the space the transformer sees:
        (VACE_CHANNELS, F, H, W): nothing inactive, the object's track at unit amplitude as the reactive frames (what
        a tracking control video encodes to), and the mask all ones (every pixel under control)."""
        track = self.colour(cls)[:, None, None, None] * self.pattern(cls, y, x, frames, side)[None]
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
            more = []  # the class's other objects, drawn last (a one-object world draws what it always drew)
            for _ in range(self.config.objects - 1):
                more.append(starts[int(torch.randint(0, len(starts), (1,), generator=g))])
                coeffs.insert(len(more), 0.5 + 0.5 * float(torch.rand(1, generator=g)))
            basis = self.basis(c, y, x, frames, side, pan, tuple(more))
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
        amplitude and background; returns its relative L2 to the latent and its class. In a world of several
        objects a sample, each class's template is found greedily: the best one object, then the best next given
        those found (at their pan)."""
        frames, side = latent.shape[1], latent.shape[3]
        target = latent.reshape(-1).double()
        best = None
        for c in range(len(self.classes)):
            places = [(y, x, pan) for y, x in self.starts(c, frames, side) for pan in range(len(self.pans))]
            error, place = self._best(target, c, places, frames, side)
            found = [place[:2]]
            for _ in range(self.config.objects - 1):
                places = [(y, x, place[2]) for y, x in self.starts(c, frames, side) if (y, x) not in found]
                error, more = self._best(target, c, places, frames, side, tuple(found))
                found.append(more[:2])
            if best is None or error < best[0]:
                best = (error, c, place, found[1:])
        out = {"rel_l2": best[0], "class": best[1], "start": list(best[2][:2]), "pan": best[2][2]}
        if best[3]:
            out["more"] = [list(start) for start in best[3]]
        return out

    def _best(self, target: torch.Tensor, cls: int, places: list, frames: int, side: int,
              found: tuple = ()) -> tuple[float, tuple]:
        """The place (y, x, pan) of `places` whose template (with the objects `found` besides it) fits `target`
        best by least squares: (its relative L2, the place)."""
        bases = torch.stack([self.basis(cls, y, x, frames, side, pan, found).reshape(-1, target.numel())
                             for y, x, pan in places]).double()
        gram = bases @ bases.transpose(1, 2)
        if found:  # two objects may overlap: a tiny ridge keeps the system solvable
            gram = gram + 1e-9 * gram.diagonal(dim1=1, dim2=2).mean() * torch.eye(gram.shape[1], dtype=gram.dtype)
        coeffs = torch.linalg.solve(gram, bases @ target)
        errors = (target - (coeffs[:, :, None] * bases).sum(1)).norm(dim=1) / target.norm()
        i = int(errors.argmin())
        return float(errors[i]), places[i]
