"""The WAN22_EXPERTS handle: the two experts of Wan2.2 A14B (either may be missing) as ComfyUI models.

The experts themselves are ComfyUI MODELs (ModelPatchers); this module never looks inside them, so it
stays free of ComfyUI. The handle is a value: nodes return new handles, never change one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .architecture import ExpertArchitecture
from .errors import Wan22InputError

ROLES = ("high", "low")
ROLE_WORDS = {"high": "high-noise", "low": "low-noise"}
# The input that chooses each expert, on the loaders and on the MODEL bridge alike.
EXPERT_INPUTS = {"high": "high_noise_model", "low": "low_noise_model"}
NONE = "none"

# Official Wan2.2 A14B boundaries, by task.
# Fun models train on the I2V split; TI2V-5B runs alone, so it takes every step whatever its boundary.
DEFAULT_BOUNDARY = {"t2v": 0.875, "i2v": 0.900, "fun_control": 0.900, "ti2v": 0.875}


@dataclass(frozen=True)
class LoraNote:
    """A LoRA that the LoRA node put on an expert (the weights are in the MODEL's own patches)."""

    role: str
    file: str
    strength: float
    patched_weights: int  # the model's tensors the LoRA changes

    def describe(self) -> dict:
        return {"file": self.file, "strength": self.strength, "patched_weights": self.patched_weights}


@dataclass(frozen=True, eq=False)
class Wan22Experts:
    """`high`/`low`: ComfyUI MODELs or None. `sources`: what each came from, for the report."""

    high: Any = dataclasses.field(repr=False)
    low: Any = dataclasses.field(repr=False)
    architecture: ExpertArchitecture
    sources: tuple[str, str]
    default_boundary: float
    cache_plan: Any = None
    cache_node: str | None = None  # the id of the Cache-DiT node that made the plan, for the canvas
    loras: tuple[LoraNote, ...] = ()
    parallel_plan: Any = None  # a core.parallel.ParallelPlan: the run goes to workers

    def models(self) -> dict[str, Any]:
        """The loaded experts by role: the only experts anything may touch."""
        return {role: model for role, model in zip(ROLES, (self.high, self.low)) if model is not None}

    @property
    def has_high(self) -> bool:
        return self.high is not None

    @property
    def has_low(self) -> bool:
        return self.low is not None

    @property
    def task(self) -> str:
        return self.architecture.task

    def replace(self, **changes) -> "Wan22Experts":
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        loaded = " + ".join(self.models())
        return (f"Wan2.2 {self.architecture.label} experts: {loaded} ({self.architecture.describe()})"
                + "".join(f"; {n.role} LoRA {n.file} x{n.strength:g}" for n in self.loras))


@dataclass(frozen=True)
class ExpertsPreview:
    """What a loader node's experts will be, known from its inputs and its files' headers before anything loads
    (its validation and the canvas's live split both ask for it)."""

    has_high: bool
    has_low: bool
    default_boundary: float
    boundary_known: bool = True  # False: the text-to-video boundary assumed (no header behind the MODELs)


def default_boundary(architecture: ExpertArchitecture, declared: float | None = None) -> float:
    """The model's own boundary: what a diffusers folder declares, else the official one for the task."""
    return declared if declared is not None else DEFAULT_BOUNDARY[architecture.task]


def require_some_expert(high, low, *, empty: str = "'none'", fix: str = "load at least one expert") -> None:
    """`high`/`low`: what each expert input holds (a file name, a MODEL), None or "none" when nothing."""
    if all(x is None or x == NONE for x in (high, low)):
        raise Wan22InputError("high_noise_model", f"low_noise_model and high_noise_model are both {empty}: {fix}")
