"""The error budget's mechanics in a real ComfyUI, on random weights (what it costs in quality is measured
on the trained bed by bench/quality.py): 0 caches nothing, a budget no cached step fits in is refused by name,
the sampler's report carries the budget and each expert's threshold, and nothing stays on the experts."""

import json

import torch

from .cache_state import leftovers
from .prompts import (FINAL, diffusion_models, expert_files, failed_at_run, latent_of, loader, our_prompt, report_of,
                      run_ok, text_folder)

RUN = dict(sampler="euler", steps=10, flow_shift=5.0, seed=4, width=32, height=32, length=1)
WARM_UP_ONE = {"high_warmup_steps": 1, "low_warmup_steps": 1}


def budget_prompt(tiny, budget, calibration_seed=4, **run):
    """Experts -> Cache-DiT -> Error Budget (calibrated on the sampler's own schedule, text and latent) -> sampler."""
    p = our_prompt(loader(*expert_files(tiny)), text_folder(tiny), cache=WARM_UP_ONE, **{**RUN, **run})
    p["21"] = {"class_type": "Wan22CacheBudget",
               "inputs": {"experts": ["20", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                          "latent_image": ["4", 0], "seed": calibration_seed, "cfg_high": 4.0, "cfg_low": 3.0,
                          "error_budget": budget}}
    p["22"] = {"class_type": "PreviewAny", "inputs": {"source": ["21", 1]}}
    p["5"]["inputs"]["experts"] = ["21", 0]
    return p


def uncached_latent(comfyui, tiny, **run):
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny)), text_folder(tiny), **{**RUN, **run}))
    return latent_of(comfyui, FINAL["ours"])


def relative_l2(reference, other):
    return float((other - reference).norm() / reference.norm())


def test_a_budget_of_zero_caches_nothing(comfyui, tiny_models):
    result = run_ok(comfyui, budget_prompt(tiny_models, 0.0))
    report = report_of(result)
    latent = latent_of(comfyui, FINAL["ours"])
    for role in ("high", "low"):
        assert report["cache"][role]["cached_steps"] == [] and report["cache"][role]["error_budget"] == 0.0
        assert not report["cache"][role]["cached"]  # capped at 0: cache-dit was never installed
    assert torch.equal(latent, uncached_latent(comfyui, tiny_models))


def test_a_met_budget_holds_on_its_calibration_run_and_the_report_names_budget_and_thresholds(comfyui, tiny_models):
    budget = 0.5
    result = run_ok(comfyui, budget_prompt(tiny_models, budget))
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    report = report_of(result)
    cached = latent_of(comfyui, FINAL["ours"])
    models = diffusion_models(comfyui)
    assert calibration["error_budget"] == budget and calibration["trials"]
    assert "error budget 0.5" in report["cache"]["plan"]
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["error_budget"] == budget
        assert stats["threshold"] == calibration["thresholds"][role]
    assert any(report["cache"][role]["cached_steps"] for role in ("high", "low"))
    error = relative_l2(uncached_latent(comfyui, tiny_models), cached)
    assert error == calibration["calibration_error"] <= budget  # each seed within the budget
    assert (error + calibration["confirmation_error"]) / 2 <= budget * calibration["margin"]  # their mean, its margin
    for model in models.values():
        assert leftovers(model) == []


def test_the_calibrated_settings_are_confirmed_on_the_next_seed(comfyui, tiny_models):
    """The search keeps settings only when the next seed's run fits the budget too: the calibration's
    confirmation error is that run's, measured here by the sampler at seed 5 against its uncached run."""
    budget = 0.5
    run_ok(comfyui, budget_prompt(tiny_models, budget, seed=5))  # calibrated on seed 4, sampled at seed 5
    calibration = json.loads(comfyui.cached_output("21")[1][0])
    assert calibration["confirmations"] and calibration["confirmations"][-1]["thresholds"] == \
        calibration["thresholds"]
    cached = latent_of(comfyui, FINAL["ours"])
    error = relative_l2(uncached_latent(comfyui, tiny_models, seed=5), cached)
    assert error == calibration["confirmation_error"] <= budget


def test_a_budget_no_cached_step_fits_in_is_refused_naming_error_budget(comfyui, tiny_models):
    message = failed_at_run(comfyui, budget_prompt(tiny_models, 1e-6))
    assert message.startswith("error_budget: 1e-06 cannot be met"), message
    # the next run is as if the refused one never happened
    assert torch.equal(latent_of_budget_zero(comfyui, tiny_models), uncached_latent(comfyui, tiny_models))


def latent_of_budget_zero(comfyui, tiny):
    run_ok(comfyui, budget_prompt(tiny, 0.0))
    return latent_of(comfyui, FINAL["ours"])
