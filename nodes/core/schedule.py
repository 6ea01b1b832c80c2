"""The boundary and the high/low split of a Wan2.2 A14B run, counted from the sigmas the run steps through.

The sigmas are ComfyUI's own (its scheduler, with the flow shift applied as ModelSamplingSD3 applies it);
the glue computes them once and the sampler steps through exactly those. This module counts the split
from them with one routing rule, `Boundary.routes_high`, so nothing computes the schedule a second way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

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
    if not isinstance(name, str):
        raise Wan22InputError("sampler", f"{name!r} is not a sampler name: use one of ComfyUI's KSampler samplers "
                                         "(uni_pc, euler, dpmpp_2m, ...)")
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


STAGES = ("lead", "high", "low")  # in the order a run goes through them
STAGE_WORDS = {"lead": "lead", "high": "high-noise", "low": "low-noise", "model": "sampled"}
MAX_LEAD_STEPS = MAX_STEPS


def lead_hand_off(lead_sigmas, main_start: float) -> tuple[int, bool]:
    """Where a lead stage on its own finer schedule (`lead_sigmas`, N + 1 values) hands over to the main
    schedule at the sigma `main_start`: (the lead steps it runs, whether its last step lands on
    `main_start` exactly). It runs until its sigma reaches `main_start`; where no sigma of its own equals it,
    its last step goes from its last sigma above `main_start` to `main_start`, a step of its own size."""
    main_start = float(main_start)
    for i, sigma in enumerate(lead_sigmas):
        if i > 0 and float(sigma) <= main_start:
            return i, float(sigma) == main_start
    raise Wan22InputError("lead_steps", "the lead schedule never reaches the main schedule's start sigma")


@dataclass(frozen=True)
class LeadStage:
    """A stage before the main schedule, on the high-noise expert of another handle (usually the one without
    the LoRAs) with its own CFG, stepping a finer schedule of its own (same sampler, scheduler and shift)
    until it reaches the sigma the main schedule's step `start_step` starts from."""

    steps: int  # steps of the lead's own schedule
    start_step: int  # the main schedule's step the lead hands over to
    cfg: float
    sigmas: tuple[float, ...]  # the lead's own schedule, every step and the final sigma
    main_start: float  # the sigma the main schedule's step `start_step` starts from
    end_step: int  # the lead steps run (its schedule's steps 0 to end_step)
    exact: bool  # its last step lands on the main start sigma exactly (else a last step of its own size)
    source: str = "MODEL"  # what the lead expert came from, for the report
    architecture: Any = dataclasses.field(default=None, compare=False)

    def stage_sigmas(self) -> tuple[float, ...]:
        """The sigmas the lead steps through: its own down to the main start sigma, which ends them."""
        return self.sigmas[: self.end_step] + (self.main_start,)

    def hand_off(self) -> str:
        """How the lead hands over, in words (the report and the node's text say it)."""
        if self.exact:
            return (f"exact: the lead's step {self.end_step} of {self.steps} is the main schedule's step "
                    f"{self.start_step} (sigma {self.main_start:.6g}), as three KSamplerAdvanced run it")
        return (f"no sigma of the lead's {self.steps}-step schedule is the main schedule's step {self.start_step} "
                f"(sigma {self.main_start:.6g}): the lead's last step goes from {self.sigmas[self.end_step - 1]:.6g} "
                f"to {self.main_start:.6g}, a step of its own size, as SamplerCustomAdvanced on those sigmas runs it")


@dataclass(frozen=True)
class RunSchedule:
    """The WAN22_SCHEDULE handle: what one run will do, as a value. `split` is the main schedule's split at
    the boundary; with a lead stage, the main schedule starts at the lead's `start_step`."""

    sampler: str
    scheduler: str
    steps: int  # as asked: what ComfyUI's KSampler is given
    flow_shift: float
    boundary: Boundary
    sigmas: tuple[float, ...]  # one per step the run takes, then the final sigma (0)
    split: tuple[int, int]
    has_high: bool
    has_low: bool
    model_default: float
    lead: LeadStage | None = None

    @property
    def high_steps(self) -> int:
        return self.split[0]

    @property
    def low_steps(self) -> int:
        return self.split[1]

    @property
    def run_steps(self) -> int:
        """The steps the run takes: `steps`, except where ComfyUI's scheduler makes a different count of
        sigmas (ddim_uniform: 12 steps when 11 are asked), which KSampler then steps through."""
        return len(self.sigmas) - 1

    @property
    def main_start(self) -> int:
        """The main schedule's first step: 0, or where a lead stage hands over."""
        return self.lead.start_step if self.lead is not None else 0

    def stage_bounds(self, stage: str) -> tuple[int, int]:
        """(first step, end step) of a main-schedule stage, in the main schedule's steps."""
        switch = max(self.high_steps, self.main_start)
        return (self.main_start, switch) if stage == "high" else (switch, self.run_steps)

    def stage_steps(self) -> dict[str, int]:
        """The steps each stage of the run takes, in run order; a stage with none is left out."""
        counts = {"lead": self.lead.end_step} if self.lead is not None else {}
        for stage in ("high", "low"):
            start, end = self.stage_bounds(stage)
            counts[stage] = end - start
        return {stage: n for stage, n in counts.items() if n > 0}

    def stage_split(self) -> dict[str, int]:
        """The steps of every stage, 0 for a stage with none: what the report and the canvas show."""
        counts = self.stage_steps()
        return {stage: counts.get(stage, 0) for stage in STAGES}

    def stage_sigmas(self, stage: str) -> tuple[float, ...]:
        """The sigmas of one stage: the lead's own, or the main schedule's as ComfyUI's SplitSigmas cuts them at
        the lead's hand-off and at the switch."""
        if stage == "lead":
            return self.lead.stage_sigmas() if self.lead is not None else ()
        start, end = self.stage_bounds(stage)
        return self.sigmas[start: end + 1]

    def with_lead(self, lead: LeadStage | None) -> "RunSchedule":
        return dataclasses.replace(self, lead=lead)

    def split_words(self) -> str:
        counts = self.stage_steps()
        words = []
        if self.lead is not None:
            words.append(f"{counts.get('lead', 0)} lead (of {self.lead.steps})")
        words += [f"{counts.get(stage, 0)} {stage}" for stage in ("high", "low")]
        return " / ".join(words)

    def summary(self) -> str:
        ratio = "pinned" if self.boundary.ratio is None else f"{self.boundary.ratio:g}"
        steps = f"{self.steps} steps" + ("" if self.run_steps == self.steps else
                                         f" ({self.scheduler} makes them {self.run_steps})")
        text = (f"{self.sampler}/{self.scheduler}, {steps}, shift {self.flow_shift:g}, boundary {ratio} "
                f"({self.boundary.source}): ")
        if self.lead is None:
            return text + f"{self.high_steps} high / {self.low_steps} low"
        return (text + f"{self.split_words()}; main from step {self.lead.start_step}, lead at CFG "
                       f"{self.lead.cfg:g}; hand-off {self.lead.hand_off()}")


def sigma_values(sigmas) -> tuple[float, ...]:
    """Sigmas given as values, or as a function that computes them once the inputs they need are checked."""
    return tuple(float(s) for s in (sigmas() if callable(sigmas) else sigmas))


def add_lead(schedule: RunSchedule, *, lead_sigmas, steps: int, start_step: int, cfg: float, source: str = "MODEL",
             architecture=None) -> RunSchedule:
    """The schedule with a lead stage in front: `lead_sigmas` are the lead's own schedule (`steps` + 1), or
    the function that computes them from the checked inputs."""
    check_lead_inputs(schedule, steps=steps, start_step=start_step, cfg=cfg)
    lead_sigmas = sigma_values(lead_sigmas)
    if len(lead_sigmas) < 2:
        raise ValueError(f"{len(lead_sigmas)} lead sigmas for {steps} steps")
    main_start = schedule.sigmas[int(start_step)]
    end_step, exact = lead_hand_off(lead_sigmas, main_start)
    return schedule.with_lead(LeadStage(steps=int(steps), start_step=int(start_step), cfg=float(cfg),
                                        sigmas=lead_sigmas, main_start=main_start, end_step=end_step, exact=exact,
                                        source=source, architecture=architecture))


def check_lead_inputs(schedule: RunSchedule | None, *, steps=None, start_step=None, cfg=None) -> None:
    """Refuses a lead stage that cannot run, naming the lead node's input."""
    if steps is not None and not (1 <= int(steps) <= MAX_LEAD_STEPS):
        raise Wan22InputError("lead_steps", f"{steps} is out of range: use between 1 and {MAX_LEAD_STEPS} steps")
    if cfg is not None and not (math.isfinite(float(cfg)) and float(cfg) >= 0):
        raise Wan22InputError("cfg", f"{cfg} is not allowed: use a CFG scale of 0 or more (3.5 for the lead)")
    if schedule is None or start_step is None:
        return
    if schedule.lead is not None:
        raise Wan22InputError("schedule", "this schedule already has a lead stage: connect the Boundary & Flow Shift "
                                          "node's schedule, not another lead stage's")
    if not schedule.has_high:
        raise Wan22InputError("schedule", "a lead stage runs the high-noise expert before the main schedule, but "
                                          "this schedule's experts have no high-noise expert")
    if not (1 <= int(start_step) < schedule.run_steps):
        raise Wan22InputError("start_step", f"{start_step} is out of range: the main schedule has "
                                            f"{schedule.run_steps} steps, so hand over at a step between 1 and "
                                            f"{schedule.run_steps - 1}")


def build_schedule(*, sampler: str, scheduler: str, steps: int, flow_shift: float, sigmas, has_high: bool,
                   has_low: bool, model_default: float, custom_ratio: float | None = None,
                   schedulers=None) -> RunSchedule:
    """Resolves the boundary and counts the split from the run's own sigmas (values, or the function that
    computes them from the checked inputs; `schedulers`: the scheduler names there are, when known)."""
    check_schedule_inputs(steps=steps, flow_shift=flow_shift, boundary_ratio=custom_ratio,
                          scheduler=None if schedulers is None else scheduler, schedulers=schedulers or ())
    sigmas = sigma_values(sigmas)
    if len(sigmas) < 2:  # ComfyUI's schedulers give steps + 1 sigmas, or about that many (ddim_uniform)
        raise ValueError(f"{len(sigmas)} sigmas for {steps} steps: a run has at least one step and a final sigma")
    boundary = resolve_boundary(has_high=has_high, has_low=has_low, model_default=model_default,
                                custom_ratio=custom_ratio)
    return RunSchedule(sampler=sampler, scheduler=scheduler, steps=int(steps), flow_shift=float(flow_shift),
                       boundary=boundary, sigmas=sigmas, split=count_split(sigmas, boundary), has_high=has_high,
                       has_low=has_low, model_default=float(model_default))
