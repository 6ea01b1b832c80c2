"""Samplers, boundary resolution and the high/low split of a Wan2.2 A14B run.

The split is counted from the very scheduler object that the denoising loop steps through
(`Wan22Schedule.new_scheduler`), with the one routing rule `Boundary.routes_high`; nothing
computes the schedule a second way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from .errors import Wan22InputError

NUM_TRAIN_TIMESTEPS = 1000

# Official Wan2.2 A14B boundaries, by task (text-to-video, image-to-video).
DEFAULT_BOUNDARY = {"t2v": 0.875, "i2v": 0.900}


def _unipc(flow_shift: float):
    return UniPCMultistepScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS, prediction_type="flow_prediction",
                                   use_flow_sigmas=True, flow_shift=flow_shift)


def _euler(flow_shift: float):
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS, shift=flow_shift)


def _dpmpp(flow_shift: float):
    return DPMSolverMultistepScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS, prediction_type="flow_prediction",
                                       use_flow_sigmas=True, flow_shift=flow_shift)


# name -> factory(flow_shift) of a diffusers scheduler. "unipc" is what the official Wan2.2 code uses.
SAMPLERS = {"unipc": _unipc, "euler": _euler, "dpmpp": _dpmpp}

BOUNDARY_MODES = ("auto", "custom")
MAX_STEPS = 1000


@dataclass(frozen=True)
class Boundary:
    """Where the run switches experts, and why.

    `ratio` is None when the loaded experts pin the route (only one expert loaded): then every step
    goes to that expert, whatever the timestep. Routing never compares against a ratio in that case,
    because Euler's first timestep is 1000.0 and would ask a low-noise-only run for the missing expert.
    """

    ratio: float | None
    source: str  # "low_noise_only" | "high_noise_only" | "custom" | "model_default"

    def routes_high(self, timestep: float) -> bool:
        """The rule that picks the expert for one timestep; the split is counted with it too."""
        if self.source == "low_noise_only":
            return False
        if self.source == "high_noise_only":
            return True
        return float(timestep) >= self.ratio * NUM_TRAIN_TIMESTEPS


def resolve_boundary(*, has_high: bool, has_low: bool, model_default: float,
                     custom_ratio: float | None = None) -> Boundary:
    """Boundary precedence: loaded experts pin it -> this run's custom boundary -> the model default."""
    if not has_high and not has_low:
        raise Wan22InputError("experts", "no expert is loaded: load at least one of the two experts")
    if has_low and not has_high:
        return Boundary(None, "low_noise_only")
    if has_high and not has_low:
        return Boundary(None, "high_noise_only")
    if custom_ratio is not None:
        return Boundary(float(custom_ratio), "custom")
    return Boundary(float(model_default), "model_default")


def check_schedule_inputs(sampler=None, steps=None, flow_shift=None, boundary=None, boundary_ratio=None) -> None:
    """Refuses out-of-range values before anything runs. None means "not known yet" (a linked input)."""
    if sampler is not None and sampler not in SAMPLERS:
        raise Wan22InputError("sampler", f"unknown sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
    if steps is not None and not (1 <= int(steps) <= MAX_STEPS):
        raise Wan22InputError("steps", f"{steps} is out of range: use between 1 and {MAX_STEPS} steps")
    if flow_shift is not None and not (math.isfinite(float(flow_shift)) and float(flow_shift) > 0):
        raise Wan22InputError("flow_shift", f"{flow_shift} is not allowed: the flow shift must be greater than 0 "
                                            "(Wan2.2 uses 5.0 to 12.0)")
    if boundary is not None and boundary not in BOUNDARY_MODES:
        raise Wan22InputError("boundary", f"unknown mode {boundary!r}: use 'auto' or 'custom'")
    if boundary_ratio is not None and not (0.0 <= float(boundary_ratio) <= 1.0):
        raise Wan22InputError("boundary_ratio", f"{boundary_ratio} is outside [0, 1]: use a fraction of the "
                                                "1000 training timesteps, e.g. 0.875")


def make_scheduler(sampler: str, steps: int, flow_shift: float, device=None):
    """A fresh diffusers scheduler with its timesteps set: the one object a run counts and steps with."""
    check_schedule_inputs(sampler=sampler, steps=steps, flow_shift=flow_shift)
    scheduler = SAMPLERS[sampler](float(flow_shift))
    scheduler.set_timesteps(int(steps), device=device)
    # UniPC and DPM++ round timesteps to integers, so long high-shift schedules repeat one (120 steps at
    # shift 12 start 999, 999). Left alone, the scheduler looks the first timestep up, lands on its
    # second occurrence and runs off the end of the schedule; the loop always starts at step 0.
    scheduler.set_begin_index(0)
    return scheduler


def count_split(timesteps, boundary: Boundary) -> tuple[int, int]:
    """(high-noise steps, low-noise steps) of these timesteps under this boundary."""
    high = sum(1 for t in timesteps if boundary.routes_high(t))
    return high, len(timesteps) - high


@dataclass(frozen=True)
class Wan22Schedule:
    """The WAN22_SCHEDULE handle: what one run will do, as a value."""

    sampler: str
    steps: int
    flow_shift: float
    boundary: Boundary
    timesteps: tuple[float, ...]
    sigmas: tuple[float, ...]
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

    def new_scheduler(self, device=None):
        """A fresh scheduler for the denoising loop, checked to give this schedule's timesteps."""
        scheduler = make_scheduler(self.sampler, self.steps, self.flow_shift, device)
        if tuple(float(t) for t in scheduler.timesteps) != self.timesteps:
            raise RuntimeError("the scheduler no longer gives the timesteps this schedule was built with")
        return scheduler

    def summary(self) -> str:
        ratio = "pinned" if self.boundary.ratio is None else f"{self.boundary.ratio:g}"
        return (f"{self.sampler}, {self.steps} steps, shift {self.flow_shift:g}, boundary {ratio} "
                f"({self.boundary.source}): {self.high_steps} high / {self.low_steps} low")

    def to_dict(self) -> dict:
        return {
            "sampler": self.sampler, "steps": self.steps, "flow_shift": self.flow_shift,
            "boundary_ratio": self.boundary.ratio, "boundary_source": self.boundary.source,
            "split": {"high": self.high_steps, "low": self.low_steps},
            "timesteps": list(self.timesteps),
        }


def build_schedule(*, sampler: str, steps: int, flow_shift: float, has_high: bool, has_low: bool,
                   model_default: float, custom_ratio: float | None = None) -> Wan22Schedule:
    """Resolves the boundary and counts the split from a real scheduler."""
    check_schedule_inputs(sampler=sampler, steps=steps, flow_shift=flow_shift, boundary_ratio=custom_ratio)
    boundary = resolve_boundary(has_high=has_high, has_low=has_low, model_default=model_default,
                                custom_ratio=custom_ratio)
    scheduler = make_scheduler(sampler, steps, flow_shift)
    timesteps = tuple(float(t) for t in scheduler.timesteps)
    sigmas = tuple(float(s) for s in scheduler.sigmas)
    return Wan22Schedule(sampler=sampler, steps=int(steps), flow_shift=float(flow_shift), boundary=boundary,
                         timesteps=timesteps, sigmas=sigmas, split=count_split(timesteps, boundary),
                         has_high=has_high, has_low=has_low, model_default=float(model_default))
