"""Wan2.2 Cache-DiT Error Budget: a quality asked for instead of a threshold. It runs the run it is given once
without the cache, then with candidate thresholds per expert (core.budget's search), and hands on the experts
with the thresholds that keep the final latent within the budget on that run. ComfyUI keeps its output while
its inputs stay the same, so a graph calibrates once and the sampler then runs any seed and prompt with it."""

from __future__ import annotations

import dataclasses
import json

from comfy_api.latest import io

from .core import budget as core_budget
from .core import sampler_inputs
from .core.cache import CachePlan
from .core.experts import ROLES
from .sampler_nodes import run
from .types import CATEGORY, ExpertsType, ScheduleType, linked_given, linked_only


def relative_l2(reference, other) -> float:
    return float((other.float() - reference.float()).norm() / reference.float().norm().clamp(min=1e-12))


def with_thresholds(plan: CachePlan, thresholds: dict, budget: float | None) -> CachePlan:
    """The plan with each expert's own threshold; an expert given None is not cached (max_cached_steps 0)."""
    changes = {}
    for role, threshold in thresholds.items():
        settings = plan.settings(role)
        changes[role] = (dataclasses.replace(settings, max_cached_steps=0) if threshold is None
                         else dataclasses.replace(settings, residual_diff_threshold=float(threshold)))
    return dataclasses.replace(plan, error_budget=budget, **changes)


def confirming_seed(seed: int) -> int:
    return (int(seed) + 1) % 2 ** 64


def calibrate(experts, schedule, positive, negative, latent: dict, seed: int, cfg: dict,
              error_budget: float) -> tuple[object, core_budget.Calibration]:
    """(the experts with the calibrated plan, the calibration): the uncached run, then the search's runs, each
    through the sampler node's run (so each stage's cache is installed for that stage only and removed after it,
    on the plan's workers when the experts carry one); the settings within the budget are confirmed on the next
    seed, against its own uncached run."""
    core_budget.check_budget(error_budget)
    plan = experts.cache_plan or CachePlan()
    roles = tuple(role for role in ROLES if experts.models().get(role) is not None)
    if float(error_budget) == 0:
        calibration = core_budget.calibrate(0.0, roles, None, 0)
        return experts.replace(cache_plan=with_thresholds(plan, calibration.thresholds, 0.0)), calibration
    references: dict = {}

    def sample(thresholds: dict | None, at_seed: int):
        trial_plan = None if thresholds is None else with_thresholds(plan, thresholds, None)
        return run(experts.replace(cache_plan=trial_plan), schedule, positive, negative, latent, at_seed,
                             cfg)

    def reference(at_seed: int):
        if at_seed not in references:
            references[at_seed] = sample(None, at_seed)
        return references[at_seed]

    def measurer(at_seed: int):
        def measure(thresholds: dict) -> core_budget.Trial:
            uncached = reference(at_seed)[0]["samples"]
            out, trial = sample(thresholds, at_seed)
            forwards = sum(stats["block_forwards"] for stats in trial.cache.values())
            return core_budget.Trial(thresholds, relative_l2(uncached, out["samples"]), forwards)
        return measure

    uncached_forwards = sum(reference(seed)[1].calls.values()) * experts.architecture.num_layers
    calibration = core_budget.calibrate(float(error_budget), roles, measurer(seed), uncached_forwards,
                                        confirm=measurer(confirming_seed(seed)))
    return experts.replace(cache_plan=with_thresholds(plan, calibration.thresholds, float(error_budget))), calibration


def calibration_report(calibration: core_budget.Calibration) -> dict:
    def runs(trials: list) -> list:
        return [{"thresholds": t.thresholds, "error": round(t.error, 6), "block_forwards": t.block_forwards}
                for t in trials]
    return {"error_budget": calibration.budget, "target": calibration.target, "margin": core_budget.MARGIN,
            "thresholds": calibration.thresholds, "calibration_error": calibration.error,
            "confirmation_error": calibration.confirmation_error, "block_forwards": calibration.block_forwards,
            "block_forwards_without_cache": calibration.uncached_block_forwards,
            "trials": runs(calibration.trials), "confirmations": runs(calibration.confirmations)}


class Wan22CacheBudget(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22CacheBudget",
            display_name="Wan2.2 Cache-DiT Error Budget",
            category=CATEGORY,
            description="Asks for a quality instead of a threshold: runs the given run once without the cache and "
                        "then with candidate thresholds on each expert, and hands on the experts with the per-expert "
                        "thresholds that keep the final latent within error_budget (relative L2 to the uncached "
                        "run) on that run and on the same run at the next seed, their mean within 0.75 of it. It "
                        "costs 15 to 30 runs, once: "
                        "ComfyUI keeps its output while its inputs stay the same, so calibrate on a short or small "
                        "run and keep it for others with the same sampler, steps, shift and CFG.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts with a Cache-DiT plan (its warm-ups, caps and "
                                                     "blocks are kept; only the thresholds are calibrated). Without "
                                                     "one, the Cache-DiT node's defaults."),
                ScheduleType.Input("schedule", tooltip="The run to calibrate on: the same schedule as the sampler's."),
                io.Conditioning.Input("positive", tooltip="The calibration run's positive conditioning."),
                io.Conditioning.Input("negative", tooltip="The calibration run's negative conditioning."),
                io.Latent.Input("latent_image", tooltip="The calibration run's latent (its size and frames "
                                                        "should be the sampler's)."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF,
                             tooltip="The calibration run's seed (keep it fixed: another seed calibrates anew); the "
                                     "settings are confirmed on the next seed too."),
                io.Float.Input("cfg_high", default=4.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG of the high-noise expert, as on the sampler."),
                io.Float.Input("cfg_low", default=3.0, min=0.0, max=30.0, step=0.1, round=0.01,
                               tooltip="CFG of the low-noise expert, as on the sampler."),
                io.Float.Input("error_budget", default=0.03, min=0.0, max=core_budget.MAX_BUDGET, step=0.005,
                               tooltip="The change the cache may make to the final latent: relative L2 against the "
                                       "uncached run (0.01 barely visible, 0.05 a small change). 0 caches nothing. "
                                       "A budget that no cached step fits in is refused."),
            ],
            outputs=[
                ExpertsType.Output(display_name="experts", tooltip="The experts with each expert's calibrated "
                                                                   "threshold, for the sampler."),
                io.String.Output(display_name="calibration", tooltip="JSON: the budget, each expert's threshold, "
                                                                     "and every calibration run's error and blocks."),
            ],
        )

    @classmethod
    def validate_inputs(cls, experts=None, schedule=None, positive=None, negative=None, latent_image=None):
        return linked_only(experts=experts, schedule=schedule, positive=positive, negative=negative,
                           latent_image=latent_image)

    @classmethod
    def execute(cls, experts, schedule, positive, negative, latent_image, seed, cfg_high, cfg_low,
                error_budget) -> io.NodeOutput:
        linked_given(experts=experts, schedule=schedule, positive=positive, negative=negative,
                     latent_image=latent_image)
        sampler_inputs.check_sampler_inputs(experts.architecture, positive, negative, latent_image)
        cfg = {"high": float(cfg_high), "low": float(cfg_low)}
        calibrated, calibration = calibrate(experts, schedule, positive, negative, latent_image, seed, cfg,
                                            error_budget)
        text = calibration.describe() if calibration.trials else "error budget 0: nothing is cached"
        return io.NodeOutput(calibrated, json.dumps(calibration_report(calibration)), ui={"text": [text]})
