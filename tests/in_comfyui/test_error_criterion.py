"""The error criterion (the Cache-DiT nodes' default) in a real ComfyUI, on random weights (what it costs in
quality is measured on the trained beds by bench/quality/): it caches while its estimate fits the target, the
report says what it used and what it estimated, a target of 0 caches nothing, runs repeat bit for bit, the MODEL
node on each expert equals the pack's sampler, saved prompts keep the threshold, and nothing stays behind."""

import json

import torch

from .cache_state import leftovers
from .prompts import (FINAL, bridged, diffusion_models, expert_files, latent_of, loader, native_prompt, our_prompt,
                      report_of, run_ok, text_folder, with_model_caches, with_start_image)

SMALL = dict(width=32, height=32, length=1, steps=12, flow_shift=5.0)
# On these random experts the criterion caches nothing at 0.002 and as much as the caps allow from 0.01 on: a large
# target lets them cache whatever they can.
ERROR = {"criterion": "error", "error_target": 0.6, "high_warmup_steps": 1, "low_warmup_steps": 1}


def prompt(tiny, cache, **run):
    return our_prompt(loader(*expert_files(tiny)), text_folder(tiny), cache=cache, **{**SMALL, **run})


def test_it_caches_within_its_target_repeats_a_b_a_and_the_report_gives_its_estimate(comfyui, tiny_models):
    latents, reports = [], []
    for seed in (3, 4, 3):
        reports.append(report_of(run_ok(comfyui, prompt(tiny_models, ERROR, seed=seed))))
        latents.append(latent_of(comfyui, FINAL["ours"]))
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])
    report = reports[0]
    assert any(report["cache"][role]["cached_steps"] for role in ("high", "low"))
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["criterion"] == "error" and stats["threshold"] is None
        assert abs(stats["error_target_share"] - 0.6 * 0.5 ** 0.5) < 1e-6  # the experts' errors add in quadrature
        assert stats["miss_per_change"] and all(rho > 0 for rho in stats["miss_per_change"])  # measured in the run
        assert 0 <= stats["estimated_error"] <= stats["error_target_share"] + 1e-9
        assert "_E0.6" in stats["config"]
    assert all(leftovers(model) == [] for model in diffusion_models(comfyui).values())


def test_a_larger_target_caches_more(comfyui, tiny_models):
    cached = []
    for target in (0.002, 0.005, 0.01):
        report = report_of(run_ok(comfyui, prompt(tiny_models, {**ERROR, "error_target": target}, seed=5)))
        cached.append(sum(len(report["cache"][r]["cached_steps"]) for r in ("high", "low")))
    assert cached == sorted(cached) and cached[0] < cached[-1]


def test_a_target_below_every_steps_change_caches_nothing_and_says_so_as_a_right_answer(comfyui, tiny_models):
    result = run_ok(comfyui, prompt(tiny_models, {**ERROR, "error_target": 1e-4}, seed=5))
    report, text = report_of(result), result.outputs["5"]["text"][0]
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["cached"] and stats["cached_steps"] == [] and stats.get("below_smallest_step"), stats
        assert stats["note"].startswith("cached nothing, rightly") and "error_target above" in stats["note"]
        assert f"cache {role}: 0 of {stats['evaluations']} steps cached" in text
    assert text.count("cached nothing, rightly") == 2


def test_a_target_of_zero_runs_without_the_cache_and_equals_the_uncached_run(comfyui, tiny_models):
    report = report_of(run_ok(comfyui, prompt(tiny_models, {**ERROR, "error_target": 0.0}, seed=6)))
    zero = latent_of(comfyui, FINAL["ours"])
    assert all(not report["cache"][role]["cached"] and "error target is 0" in report["cache"][role]["note"]
               for role in ("high", "low"))
    run_ok(comfyui, prompt(tiny_models, None, seed=6))
    assert torch.equal(zero, latent_of(comfyui, FINAL["ours"]))


def test_the_model_node_on_each_expert_equals_the_samplers_cache(comfyui, tiny_models):
    """Each Cache-DiT MODEL node takes one expert's share of the target, as the sampler gives each stage."""
    run = dict(sampler="euler", scheduler="simple", steps=16, flow_shift=5.0, cfg=(3.5, 3.5), width=32, height=32,
               length=1)
    report = report_of(run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models),
                                                  seed=4, cache=ERROR, **run)))
    ours = latent_of(comfyui, FINAL["ours"])
    assert report["cache"]["high"]["cached_steps"] or report["cache"]["low"]["cached_steps"]
    per_role = {"warmup_steps": 1, "criterion": "error", "error_target": ERROR["error_target"]}
    native = native_prompt(*expert_files(tiny_models), text_folder(tiny_models), switch=report["split"]["high"],
                           seed=4, **run)
    run_ok(comfyui, with_model_caches(native, high=dict(per_role, max_cached_steps=-1),
                                      low=dict(per_role, max_cached_steps=20)))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_a_prompt_saved_before_the_criterion_keeps_the_threshold_it_saved(comfyui, tiny_models):
    p = prompt(tiny_models, {"residual_diff_threshold": 0.24})
    for name in ("criterion", "error_target"):
        del p["20"]["inputs"][name]
    stats = json.loads(run_ok(comfyui, p).outputs["6"]["text"][0])["cache"]["high"]
    assert stats["criterion"] == "threshold" and stats["threshold"] == 0.24


def test_an_image_to_video_run_measures_its_miss_on_the_latent_under_the_start_images_channels(comfyui, tiny_models,
                                                                                             start_image):
    """WanImageToVideo's start image reaches the transformer as channels after the latent's: the miss is measured
    against the latent's own channels, and the run caches and repeats as a text-to-video run does."""
    high, low = expert_files(tiny_models, "i2v")
    latents = []
    for _ in range(2):  # each in an executor of its own: ComfyUI would serve the second from its cache
        prompt = with_start_image(our_prompt(bridged(high, low), text_folder(tiny_models), cache=ERROR, steps=12,
                                             flow_shift=5.0, seed=4), ["5"])
        executor = comfyui.new_executor()
        report = report_of(run_ok(comfyui, prompt, executor))
        latents.append(latent_of(comfyui, FINAL["ours"], executor))
    assert torch.equal(latents[0], latents[1])
    assert any(report["cache"][role]["cached_steps"] for role in ("high", "low"))
    assert all(report["cache"][role]["miss_per_change"] for role in ("high", "low"))
