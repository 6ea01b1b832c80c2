"""The CFG split on two Ray workers on the CPU (gloo), in a real ComfyUI: at a stage whose CFG is above 1 each
worker runs one of the evaluation's two prompts; the run equals one process within the plan's tolerance, the
cache caches the steps one process caches, and `auto` picks the split per stage from its CFG."""

from __future__ import annotations

import pytest

from . import prompts as P
from .test_parallel import near_one_process, two_heads, with_plan

pytest.importorskip("ray", reason="the parallel plan's tests need Ray (requirements-dev.txt)")
pytest.importorskip("yunchang", reason="the parallel plan's tests need yunchang (requirements-dev.txt)")


def alone_and_split(comfyui, prompt, **plan):
    """(one process's report and latent, the plan's report and latent) of the same prompt."""
    alone = P.report_of(P.run_ok(comfyui, prompt)), P.latent_of(comfyui, "5")
    split = P.report_of(P.run_ok(comfyui, with_plan(prompt, **plan))), P.latent_of(comfyui, "5")
    return alone, split


def test_auto_splits_the_prompts_at_cfg_above_one_and_the_sequence_at_cfg_one_and_equals_one_process(
        comfyui, tiny_models, parallel_experts):
    prompt = two_heads(parallel_experts, tiny_models, sampler="uni_pc", cfg=(3.5, 1.0))
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto")
    assert report["parallel"]["split"] == "auto"
    assert report["parallel"]["stage_splits"] == {"high": "cfg", "low": "ulysses"}
    assert report["transformer_calls"] == alone["transformer_calls"] and report["split"] == alone["split"]
    assert near_one_process(latent, alone_latent)


CASES = {
    "t2v-euler-lora": dict(task="t2v", sampler="euler", cfg=(4.0, 3.0), lora=True),
    "i2v-uni_pc": dict(task="i2v", sampler="uni_pc", cfg=(3.5, 3.5)),
    "i2v-euler-lora": dict(task="i2v", sampler="euler", cfg=(4.0, 3.0), lora=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_cfg_split_equals_one_process(comfyui, tiny_models, parallel_experts, start_image, case):
    c = dict(CASES[case])
    task, lora = c.pop("task"), c.pop("lora", False)
    if lora:
        c["lora"] = {role: parallel_experts[("lora", role)] for role in ("high", "low")}
    prompt = two_heads(parallel_experts, tiny_models, task, **c)
    if task == "i2v":
        prompt = P.with_start_image(prompt, ["5"])
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="cfg")
    assert report["parallel"]["stage_splits"] == {"high": "cfg", "low": "cfg"}
    assert report["loras"] == alone["loras"] and report["transformer_calls"] == alone["transformer_calls"]
    assert near_one_process(latent, alone_latent)


@pytest.mark.slow
def test_three_stages_split_the_lead_by_its_prompts_and_the_cfg_one_stages_by_their_sequence(comfyui, tiny_models,
                                                                                            parallel_experts):
    loras = {role: parallel_experts[("lora", role)] for role in ("high", "low")}
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=8, cfg=(1.0, 1.0), lora=loras)
    prompt["41"] = P.lead_node(lead_steps=24, start_step=1, cfg=3.5)
    prompt["5"]["inputs"]["schedule"] = ["41", 0]
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto")
    assert report["parallel"]["stage_splits"] == {"lead": "cfg", "high": "ulysses", "low": "ulysses"}
    assert report["split"] == alone["split"]
    assert near_one_process(latent, alone_latent)


@pytest.mark.slow
def test_the_cached_cfg_split_caches_the_steps_one_process_caches(comfyui, tiny_models, parallel_experts):
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=40, cfg=(3.5, 3.0), cache=P.CACHING)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="cfg")
    for stage in ("high", "low"):
        one = alone["cache"][stage]
        assert one["cached_steps"], "the test's threshold should cache some steps"
        assert one["cfg_batching"] == "batched"  # both prompts in one call: the call the workers share
        assert report["cache"][stage]["cached_steps"] == one["cached_steps"]
        for rank in range(2):
            assert report["parallel"]["cached_steps"][rank][stage] == one["cached_steps"]
            ranked = report["parallel"]["residual_diffs"][rank][stage]
            assert ranked.keys() == one["residual_diffs"].keys()
            assert all(abs(ranked[k] - v) <= 1e-4 for k, v in one["residual_diffs"].items()), (rank, stage)
    assert report["parallel"]["ranks_agree"]
    assert near_one_process(latent, alone_latent)


@pytest.mark.slow
def test_the_error_criterion_on_workers_measures_the_miss_and_caches_as_one_process(comfyui, tiny_models,
                                                                                     parallel_experts):
    """The error criterion's miss rides in each call's transformer_options and is gathered as the output is: on
    the CFG split (high, CFG 3.5: each worker one prompt) and the sequence split (low, CFG 1: each worker half the
    tokens) every rank measures the whole call's miss, so the workers cache the steps one process caches, with
    the same estimate."""
    error = {"criterion": "error", "error_target": 0.6, "high_warmup_steps": 1, "low_warmup_steps": 1}
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=16, cfg=(3.5, 1.0), cache=error)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto")
    assert report["parallel"]["stage_splits"] == {"high": "cfg", "low": "ulysses"}
    for stage in ("high", "low"):
        one, split = alone["cache"][stage], report["cache"][stage]
        assert one["criterion"] == "error" and one["cached_steps"], "the test's target should cache some steps"
        assert split["cached_steps"] == one["cached_steps"]
        assert len(split["miss_per_change"]) == len(one["miss_per_change"]) > 0
        assert all(abs(a - b) <= 1e-3 * b for a, b in zip(split["miss_per_change"], one["miss_per_change"]))
        assert abs(split["estimated_error"] - one["estimated_error"]) <= 1e-3 * one["estimated_error"]
    assert report["parallel"]["ranks_agree"]
    assert near_one_process(latent, alone_latent)
