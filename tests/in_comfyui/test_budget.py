"""The error budget's mechanics in a real ComfyUI, on random weights (what it costs in quality is measured
on the trained beds by bench/quality/): 0 caches nothing, a budget no cached step fits in is refused by name,
the calibration runs small and confirms once at full size (or only at full size, as saved workflows do), the
sampler's report carries the budget and the calibrated error target, and nothing stays on the experts."""

import json

import pytest
import torch

from wan22_cachedit.nodes.core.budget import relative_l2

from .cache_state import leftovers
from .prompts import (FINAL, diffusion_models, expert_files, failed_at_run, latent_of, loader, our_prompt, report_of,
                      run_ok, text_folder)

RUN = dict(sampler="euler", steps=10, flow_shift=5.0, seed=4, width=32, height=32, length=1)
WARM_UP_ONE = {"high_warmup_steps": 1, "low_warmup_steps": 1}


def budget_prompt(tiny, budget, calibration_seed=4, calibration_size=None, calibrators=None, **run):
    """Experts -> Cache-DiT -> Error Budget (calibrated on the sampler's own schedule, text and latent) -> sampler."""
    p = our_prompt(loader(*expert_files(tiny)), text_folder(tiny), cache=WARM_UP_ONE, **{**RUN, **run})
    p["21"] = {"class_type": "Wan22CacheBudget",
               "inputs": {"experts": ["20", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                          "latent_image": ["4", 0], "seed": calibration_seed, "cfg_high": 4.0, "cfg_low": 3.0,
                          "error_budget": budget}}
    if calibration_size is not None:  # left out: a prompt saved before the input (calibrates at full size)
        p["21"]["inputs"]["calibration_size"] = calibration_size
    if calibrators is not None:  # left out: a prompt saved before the input (the plan's calibrator alone)
        p["21"]["inputs"]["calibrators"] = calibrators
    p["22"] = {"class_type": "PreviewAny", "inputs": {"source": ["21", 1]}}
    p["5"]["inputs"]["experts"] = ["21", 0]
    return p


def uncached_latent(comfyui, tiny, **run):
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny)), text_folder(tiny), **{**RUN, **run}))
    return latent_of(comfyui, FINAL["ours"])


def test_a_budget_of_zero_caches_nothing(comfyui, tiny_models):
    result = run_ok(comfyui, budget_prompt(tiny_models, 0.0, calibration_size=0.5))
    report = report_of(result)
    latent = latent_of(comfyui, FINAL["ours"])
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    assert calibration["small_runs"] == [] and calibration["full_run"] is None  # nothing was run to calibrate
    for role in ("high", "low"):
        assert report["cache"][role]["cached_steps"] == [] and report["cache"][role]["error_budget"] == 0.0
        assert not report["cache"][role]["cached"]  # error target 0: cache-dit was never installed
    assert torch.equal(latent, uncached_latent(comfyui, tiny_models))


def test_a_budget_calibrates_small_confirms_at_full_size_and_the_sampler_holds_it(comfyui, tiny_models):
    budget = 0.5
    result = run_ok(comfyui, budget_prompt(tiny_models, budget, calibration_size=0.5))
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    report = report_of(result)
    cached = latent_of(comfyui, FINAL["ours"])
    models = diffusion_models(comfyui)
    assert calibration["error_budget"] == budget and calibration["small_runs"]
    assert calibration["full_run"] is not None  # one confirmation at full size
    # the small runs' work: a quarter of the tokens each, so with the full confirmation under 3 full runs
    assert all(run["work_in_full_runs"] < 1 for run in calibration["small_runs"])
    assert calibration["work_in_full_runs"] <= 3
    assert "error budget 0.5" in report["cache"]["plan"]
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["criterion"] == "error" and stats["error_budget"] == budget and stats["threshold"] is None
    assert any(report["cache"][role]["cached_steps"] for role in ("high", "low"))
    error = relative_l2(uncached_latent(comfyui, tiny_models), cached)
    assert error <= budget
    last = (calibration["confirmed_again"] or [calibration["full_run"]])[-1]
    if last["error"] <= budget * calibration["margin"]:  # held at full size: the sampler ran the confirmed run
        assert error == pytest.approx(last["error"], abs=1e-6)  # as the report rounds it
    for model in models.values():
        assert leftovers(model) == []


def test_a_budget_that_may_choose_taylorseer_tries_it_within_the_work_and_the_sampler_runs_the_chosen_one(
        comfyui, tiny_models):
    """calibrators "none or taylorseer": the small runs try the plain cache, then TaylorSeer while the work
    allows; the last confirmation and the sampler run the calibrator chosen (its cache-dit name ends in _T1), or
    TaylorSeer follows a plain confirmation within the budget but over its aim, at the same target."""
    result = run_ok(comfyui, budget_prompt(tiny_models, 0.5, calibration_size=0.5, calibrators="none or taylorseer"))
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    runs = calibration["small_runs"]
    assert runs[0]["calibrator"] == "none" and {r["calibrator"] for r in runs} <= {"none", "taylorseer"}
    assert calibration["calibrator"] in ("none", "taylorseer") and calibration["work_in_full_runs"] <= 3
    full, last = calibration["full_run"], (calibration["confirmed_again"] or [calibration["full_run"]])[-1]
    switched = full["calibrator"] == "none" and calibration["calibrator"] == "taylorseer" and (
        calibration["margin"] * 0.5 < full["error"] <= 0.5)  # plain within the budget, over the aim: forecast
    assert last["calibrator"] == calibration["calibrator"] or (switched and last is full)
    assert ("_T1" in report_of(result)["cache"]["plan"]) == (calibration["calibrator"] == "taylorseer")
    for model in diffusion_models(comfyui).values():
        assert leftovers(model) == []


def test_a_budget_saved_before_calibration_size_calibrates_at_full_size_only(comfyui, tiny_models):
    run_ok(comfyui, budget_prompt(tiny_models, 0.5))  # the prompt of a workflow saved before the input
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    assert calibration["full_run"] is None and calibration["small_runs"]
    assert {r["calibrator"] for r in calibration["small_runs"]} == {"none"}  # and before calibrators
    assert all(run["work_in_full_runs"] >= 0.5 for run in calibration["small_runs"])  # full-size runs


def test_a_budget_no_cached_step_fits_in_is_refused_naming_error_budget(comfyui, tiny_models):
    message = failed_at_run(comfyui, budget_prompt(tiny_models, 1e-6))
    assert message.startswith("error_budget: 1e-06 cannot be met"), message
    # the next run is as if the refused one never happened
    assert torch.equal(latent_of_budget_zero(comfyui, tiny_models), uncached_latent(comfyui, tiny_models))


def latent_of_budget_zero(comfyui, tiny):
    run_ok(comfyui, budget_prompt(tiny, 0.0))
    return latent_of(comfyui, FINAL["ours"])
