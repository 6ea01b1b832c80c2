"""The boundary and the high/low split of a Wan2.2 A14B run, counted from the sigmas the run steps through.

The sigmas are ComfyUI's own (its scheduler, with the flow shift applied as ModelSamplingSD3 applies it);
the glue computes them once and the sampler steps through exactly those. This module counts the split
from them with one routing rule, `Boundary.routes_high`, so nothing computes the schedule a second way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import Wan22InputError

BOUNDARY_MODES = ("auto", "custom")
DEFAULT_CUSTOM_BOUNDARY = 0.875
MAX_STEPS = 1000
DEFAULT_SAMPLER, DEFAULT_SCHEDULER = "uni_pc", "simple"
# Workflows saved before the pack ran ComfyUI's own samplers name diffusers' schedulers; each maps to
# the ComfyUI sampler of the same method (with the `simple` scheduler, the flow-matching sigmas).
OLD_SAMPLERS = {"unipc": "uni_pc", "euler": "euler", "dpmpp": "dpmpp_2m"}


@dataclass(frozen=True)
class Boundary:
    """Where the run switches experts, and why.

    `ratio` is None when the loaded experts pin the route (only one expert loaded): every step then goes
    to that expert whatever its sigma, so a low-noise-only run never asks for the missing expert at
    sigma 1.0."""

    ratio: float | None
    source: str  # "low_noise_only" | "high_noise_only" | "custom" | "model_default"

    def routes_high(self, sigma: float) -> bool:
        """The rule that picks the expert of a step from its sigma; the split is counted with it."""
        if self.source == "low_noise_only":
            return False
        if self.source == "high_noise_only":
            return True
        return float(sigma) >= self.ratio


def resolve_boundary(*, has_high: bool, has_low: bool, model_default: float,
                     custom_ratio: float | None = None) -> Boundary:
    """Boundary precedence: the loaded experts pin it -> this run's custom boundary -> the model default."""
    if not has_high and not has_low:
        raise Wan22InputError("experts", "no expert is loaded: load at least one of the two experts")
    if has_low and not has_high:
        return Boundary(None, "low_noise_only")
    if has_high and not has_low:
        return Boundary(None, "high_noise_only")
    if custom_ratio is not None:
        return Boundary(float(custom_ratio), "custom")
    return Boundary(float(model_default), "model_default")


def sampler_name(name, samplers) -> str:
    """The ComfyUI sampler a `sampler` value means: one of `samplers`, or an old value mapped onto one."""
    if name not in samplers:
        name = OLD_SAMPLERS.get(name, name)
    if name not in samplers:
        raise Wan22InputError("sampler", f"unknown sampler {name!r}: use one of ComfyUI's KSampler samplers "
                                         "(uni_pc, euler, dpmpp_2m, ...)")
    return name


def check_schedule_inputs(*, steps=None, flow_shift=None, boundary=None, boundary_ratio=None, scheduler=None,
                          schedulers=()) -> None:
    """Refuses out-of-range values before anything runs. None means "not known yet" (a linked input)."""
    if steps is not None and not (1 <= int(steps) <= MAX_STEPS):
        raise Wan22InputError("steps", f"{steps} is out of range: use between 1 and {MAX_STEPS} steps")
    if flow_shift is not None and not (math.isfinite(float(flow_shift)) and float(flow_shift) > 0):
        raise Wan22InputError("flow_shift", f"{flow_shift} is not allowed: the flow shift must be greater than 0 "
                                            "(Wan2.2 uses 5.0 to 12.0)")
    if boundary is not None and boundary not in BOUNDARY_MODES:
        raise Wan22InputError("boundary", f"unknown mode {boundary!r}: use 'auto' or 'custom'")
    if boundary_ratio is not None and not (0.0 <= float(boundary_ratio) <= 1.0):
        raise Wan22InputError("boundary_ratio", f"{boundary_ratio} is outside [0, 1]: the boundary is a sigma "
                                                "(a fraction of the 1000 training timesteps), e.g. 0.875")
    if scheduler is not None and scheduler not in schedulers:
        raise Wan22InputError("scheduler", f"unknown scheduler {scheduler!r}: use one of {', '.join(schedulers)}")


def boundary_mode(boundary) -> str:
    """"auto" or "custom" from a schedule node's `boundary` input (see `custom_boundary`); unset is auto."""
    mode = boundary.get("boundary") if isinstance(boundary, dict) else boundary
    mode = "auto" if mode is None else mode
    check_schedule_inputs(boundary=mode)
    return mode


def custom_boundary(boundary, legacy_ratio=None) -> float | None:
    """The custom boundary ratio a schedule node's `boundary` input asks for, or None for auto.

    `boundary` is the dynamic input as ComfyUI hands it over ({"boundary": mode, "boundary_ratio": r}), or a
    bare mode; `legacy_ratio` is the top-level `boundary_ratio` of prompts saved before the ratio moved
    inside the boundary input."""
    if boundary_mode(boundary) == "auto":
        return None
    ratio = boundary.get("boundary_ratio") if isinstance(boundary, dict) else None
    ratio = ratio if ratio is not None else legacy_ratio
    if ratio is None:
        return DEFAULT_CUSTOM_BOUNDARY
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):
        raise Wan22InputError("boundary_ratio", f"{ratio!r} is not a number: give a sigma between 0 and 1, "
                                                "e.g. 0.875") from None
    check_schedule_inputs(boundary_ratio=ratio)
    return ratio


def count_split(sigmas, boundary: Boundary) -> tuple[int, int]:
    """(high-noise steps, low-noise steps) of a run through `sigmas` (one per step, then the final one).

    The high-noise expert takes the steps from the start while their sigma is at or above the boundary;
    the low-noise expert takes the rest."""
    steps = len(sigmas) - 1
    high = 0
    while high < steps and boundary.routes_high(sigmas[high]):
        high += 1
    return high, steps - high


@dataclass(frozen=True)
class RunSchedule:
    """The WAN22_SCHEDULE handle: what one run will do, as a value."""

    sampler: str
    scheduler: str
    steps: int
    flow_shift: float
    boundary: Boundary
    sigmas: tuple[float, ...]  # one per step, then the final sigma (0)
    split: tuple[int, int]
    has_high: bool
    has_low: bool
    model_default: float

    @property
    def high_steps(self) -> int:
        return self.split[0]

    @property
    def low_steps(self) -> int:
        return self.split[1]

    def stage_sigmas(self, role: str) -> tuple[float, ...]:
        """The sigmas of one expert's stage, as ComfyUI's SplitSigmas cuts them at the switch."""
        switch = self.high_steps
        return self.sigmas[: switch + 1] if role == "high" else self.sigmas[switch:]

    def summary(self) -> str:
        ratio = "pinned" if self.boundary.ratio is None else f"{self.boundary.ratio:g}"
        return (f"{self.sampler}/{self.scheduler}, {self.steps} steps, shift {self.flow_shift:g}, boundary {ratio} "
                f"({self.boundary.source}): {self.high_steps} high / {self.low_steps} low")


def build_schedule(*, sampler: str, scheduler: str, steps: int, flow_shift: float, sigmas, has_high: bool,
                   has_low: bool, model_default: float, custom_ratio: float | None = None) -> RunSchedule:
    """Resolves the boundary and counts the split from the run's own sigmas."""
    check_schedule_inputs(steps=steps, flow_shift=flow_shift, boundary_ratio=custom_ratio)
    sigmas = tuple(float(s) for s in sigmas)
    if len(sigmas) != int(steps) + 1:
        raise ValueError(f"{len(sigmas)} sigmas for {steps} steps: a run has one sigma per step and a final one")
    boundary = resolve_boundary(has_high=has_high, has_low=has_low, model_default=model_default,
                                custom_ratio=custom_ratio)
    return RunSchedule(sampler=sampler, scheduler=scheduler, steps=int(steps), flow_shift=float(flow_shift),
                       boundary=boundary, sigmas=sigmas, split=count_split(sigmas, boundary), has_high=has_high,
                       has_low=has_low, model_default=float(model_default))
