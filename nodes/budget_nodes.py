"""Wan2.2 Cache-DiT Error Budget: a measured quality asked for instead of a setting. The error criterion estimates
what the cache changes from the run's own statistics; this node measures how that estimate holds on the user's
own model, on a smaller latent, confirms it once at full size, and hands on the experts with the criterion's
target that meets the budget (core.budget). ComfyUI keeps its output while its inputs stay the same, so a graph
calibrates once and the sampler then runs any seed and prompt with it."""

from __future__ import annotations

import json
import math

from comfy_api.latest import io

from .core import budget as core_budget
from .core import sampler_inputs
from .core.cache import CachePlan, combined, uncached_block_forwards
from .core.errors import Wan22InputError
from .dispatch import run
from .types import CATEGORY, ExpertsType, ScheduleType, linked_given, linked_only

SAVED_CALIBRATION_SIZE = 1.0  # what a budget node saved before calibration_size calibrates at
# calibrators: which of cache-dit's calibrators the budget may choose (core.budget tries them in this order)
CALIBRATOR_CHOICES = ("none or taylorseer", "the plan's")
SAVED_CALIBRATORS = "the plan's"  # what a budget node saved before calibrators runs with


def allowed_calibrators(choice: str, plan: CachePlan) -> tuple:
    """The calibrators the budget tries, the first preferred."""
    if choice not in CALIBRATOR_CHOICES:
        raise Wan22InputError("calibrators", f"unknown choice {choice!r}: use one of {', '.join(CALIBRATOR_CHOICES)}")
    return (plan.calibrator,) if choice == "the plan's" else ("none", "taylorseer")


def smaller(latent: dict, size: float) -> dict:
    """The latent at `size` of its width and height (its frames kept: image-to-video conditioning has as many),
    even in both, at least 2: what the calibration's small runs sample."""
    import comfy.utils

    samples = latent["samples"]
    height, width = (max(2, 2 * round(d * size / 2)) for d in samples.shape[-2:])
    if (height, width) == tuple(samples.shape[-2:]):
        return latent
    out = {**latent, "samples": comfy.utils.common_upscale(samples, width, height, "bilinear", "disabled")}
    if "noise_mask" in latent:
        mask = latent["noise_mask"]
        out["noise_mask"] = comfy.utils.common_upscale(mask.reshape(-1, 1, *mask.shape[-2:]), width, height,
                                                       "bilinear", "disabled").reshape(*mask.shape[:-2], height, width)
    return out


class Runs:
    """The calibration's runs: each through the sampler node's run (each stage's cache installed for that stage
    only, on the plan's workers when the experts carry one), each uncached run once per latent; their work
    counted in full-size uncached runs (block forwards x the latent's area)."""

    def __init__(self, experts, schedule, positive, negative, latent: dict, seed: int, cfg: dict):
        self.experts, self.schedule, self.positive, self.negative = experts, schedule, positive, negative
        self.latent, self.seed, self.cfg = latent, seed, cfg
        self.plan = experts.cache_plan or CachePlan()
        self.full_area = math.prod(latent["samples"].shape[-2:])
        self.references: dict = {}  # per latent shape: (its uncached run's output, its block forwards)
        self.unit = None  # a full-size uncached run's block forwards x area

    def sample(self, latent: dict, plan):
        return run(self.experts.replace(cache_plan=plan), self.schedule, self.positive, self.negative, latent,
                   self.seed, self.cfg)

    def work(self, blocks: int, latent: dict) -> float:
        return blocks * math.prod(latent["samples"].shape[-2:]) / self.unit

    def trial(self, latent: dict, target: float, calibrator: str) -> core_budget.Trial:
        """The run at `latent` with the error criterion at `target` and `calibrator`, against its uncached run."""
        key = tuple(latent["samples"].shape)
        work = 0.0
        if key not in self.references:
            out, record = self.sample(latent, None)
            blocks = uncached_block_forwards(sum(record.calls.values()), self.experts.architecture.num_layers)
            self.references[key] = (out, blocks)
            self.unit = self.unit or blocks * self.full_area
            work += self.work(blocks, latent)
        reference, reference_blocks = self.references[key][0]["samples"], self.references[key][1]
        out, record = self.sample(latent, self.plan.with_error_target(target, calibrator=calibrator))
        stages = record.cache.values()
        smallest = [s["smallest_step_estimate"] for s in stages if s.get("smallest_step_estimate") is not None]
        blocks = sum(s["block_forwards"] for s in stages)
        return core_budget.Trial(
            target=target, error=core_budget.relative_l2(reference, out["samples"]),
            estimate=combined(s.get("estimated_error", 0.0) for s in stages),  # core.cache.error_shares
            cached=sum(len(s["cached_steps"]) + len(s["cfg_cached_steps"]) for s in stages),
            smallest=min(smallest) if smallest else None,
            work=work + self.work(blocks, latent), calibrator=calibrator, cost=blocks / reference_blocks)


def calibrate(experts, schedule, positive, negative, latent: dict, seed: int, cfg: dict, error_budget: float,
              calibration_size: float = SAVED_CALIBRATION_SIZE, calibrators: str = SAVED_CALIBRATORS
              ) -> tuple[object, core_budget.Calibration]:
    """(the experts with the calibrated plan, the calibration)."""
    core_budget.check_budget(error_budget)
    core_budget.check_size(calibration_size)
    runs = Runs(experts, schedule, positive, negative, latent, seed, cfg)
    allowed = allowed_calibrators(calibrators, runs.plan)
    small = smaller(latent, calibration_size)
    full = None if small is latent else (lambda target, calibrator: runs.trial(latent, target, calibrator))
    calibration = core_budget.calibrate(float(error_budget), lambda target, calibrator: runs.trial(
        small, target, calibrator), full, allowed)
    plan = runs.plan.with_error_target(calibration.target, float(error_budget), calibration.calibrator)
    return experts.replace(cache_plan=plan), calibration


def calibration_report(calibration: core_budget.Calibration) -> dict:
    def trial(t: core_budget.Trial | None):
        return None if t is None else {"target": round(t.target, 6), "error": round(t.error, 6),
                                       "estimate": round(t.estimate, 6), "cached": t.cached,
                                       "work_in_full_runs": round(t.work, 3), "calibrator": t.calibrator,
                                       "block_cost": round(t.cost, 4)}
    return {"error_budget": calibration.budget, "error_target": calibration.target,
            "calibrator": calibration.calibrator, "margin": core_budget.MARGIN,
            "factor": calibration.factor, "small_runs": [trial(t) for t in calibration.small],
            "full_run": trial(calibration.full), "confirmed_again": [trial(t) for t in calibration.again],
            "work_in_full_runs": round(calibration.work, 3)}


class Wan22CacheBudget(io.ComfyNode):
    # Inputs added after workflows were saved, with what those workflows run with (the canvas completes them).
    ADDED_INPUTS = {"calibration_size": SAVED_CALIBRATION_SIZE, "calibrators": SAVED_CALIBRATORS}

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22CacheBudget",
            display_name="Wan2.2 Cache-DiT Error Budget",
            category=CATEGORY,
            description="Asks for a measured quality instead of a setting: calibrates the Cache-DiT error criterion "
                        "on your model so that the final latent stays within error_budget of the uncached run "
                        "(relative L2): small plain runs on a smaller latent, the calibrator's trial (TaylorSeer, "
                        "where calibrators allows it) and a confirmation at full size (docs/quality.md, How the "
                        "budget calibrates), then hands on the experts with the calibrated target and calibrator: "
                        "about 2 to 3 full runs' work at calibration_size 0.5. ComfyUI keeps its output while its "
                        "inputs stay the same, so it calibrates once per graph.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts with a Cache-DiT plan (its warm-ups, caps and "
                                                     "blocks are kept; its criterion becomes the error criterion, "
                                                     "with the calibrated target). Without one, the Cache-DiT "
                                                     "node's defaults."),
                ScheduleType.Input("schedule", tooltip="The run to calibrate on: the same schedule as the sampler's."),
                io.Conditioning.Input("positive", tooltip="The calibration run's positive conditioning."),
                io.Conditioning.Input("negative", tooltip="The calibration run's negative conditioning."),
                io.Latent.Input("latent_image", tooltip="The calibration run's latent, at the sampler's size and "
                                                        "frames (the small runs scale its width and height)."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF,
                             control_after_generate=io.ControlAfterGenerate.fixed,
                             tooltip="The calibration runs' seed (keep it fixed: another seed calibrates anew)."),
                io.Float.Input("cfg_high", default=4.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG of the high-noise expert, as on the sampler."),
                io.Float.Input("cfg_low", default=3.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG of the low-noise expert, as on the sampler."),
                io.Float.Input("error_budget", default=0.03, min=0.0, max=core_budget.MAX_BUDGET, step=0.005,
                               tooltip="The change the cache may make to the final latent: relative L2 against the "
                                       "uncached run (0.01 barely visible, 0.05 a small change). 0 caches nothing. "
                                       "A budget smaller than what one cached step changes is refused."),
                io.Float.Input("calibration_size", default=0.5, min=core_budget.MIN_SIZE, max=1.0, step=0.05,
                               optional=True,
                               tooltip="The small runs' width and height, as a share of latent_image's (0.5: a "
                                       "quarter of the tokens, a small part of a full run's work); 1 calibrates at "
                                       "full size (2 to 4 full runs, no confirmation needed)."),
                io.Combo.Input("calibrators", options=list(CALIBRATOR_CHOICES), default=CALIBRATOR_CHOICES[0],
                               optional=True,
                               tooltip="none or taylorseer: the budget also tries cache-dit's TaylorSeer calibrator "
                                       "(a cached step's residual forecast instead of reused: fewer blocks for the "
                                       "same error where the plain cache's steps are coarse) within the same "
                                       "work, and keeps it where it runs fewer blocks, or where the plain cache's "
                                       "full run lands within the budget but over its aim (the same target "
                                       "forecast, not a cached step given up). TaylorSeer holds up to "
                                       "five tensors of the hidden state's size per prompt instead of two (at "
                                       "720p x 81 frames and CFG > 1: 7.7 GB instead of 3.1); choose the plan's "
                                       "calibrator on a card without that room."),
            ],
            outputs=[
                ExpertsType.Output(display_name="experts", tooltip="The experts with the calibrated error target, for "
                                                                   "the sampler."),
                io.String.Output(display_name="calibration", tooltip="JSON: the budget, the calibrated target, every "
                                                                     "calibration run's error and estimate, and the "
                                                                     "calibration's work in full runs."),
            ],
        )

    @classmethod
    def validate_inputs(cls, experts=None, schedule=None, positive=None, negative=None, latent_image=None):
        return linked_only(experts=experts, schedule=schedule, positive=positive, negative=negative,
                           latent_image=latent_image)

    @classmethod
    def execute(cls, experts, schedule, positive, negative, latent_image, seed, cfg_high, cfg_low,
                error_budget, calibration_size=SAVED_CALIBRATION_SIZE, calibrators=SAVED_CALIBRATORS
                ) -> io.NodeOutput:
        linked_given(experts=experts, schedule=schedule, positive=positive, negative=negative,
                     latent_image=latent_image)
        sampler_inputs.check_sampler_inputs(experts.architecture, positive, negative, latent_image)
        cfg = {"high": float(cfg_high), "low": float(cfg_low)}
        calibrated, calibration = calibrate(experts, schedule, positive, negative, latent_image, seed, cfg,
                                            error_budget, calibration_size, calibrators)
        return io.NodeOutput(calibrated, json.dumps(calibration_report(calibration)),
                             ui={"text": [calibration.describe()]})
