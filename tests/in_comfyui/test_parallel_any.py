"""Any number of Ray workers on the CPU (gloo), in a real ComfyUI: a sequence the workers do not divide, three
workers on two attention heads, and four workers as a 2 x 2 mesh (each evaluation's two prompts on two halves
of the workers, each half splitting its prompt's sequence) each equal one process, and a cached run caches the
steps one process caches with every rank holding the whole sequence's statistic."""

from __future__ import annotations

import pytest

from . import prompts as P
from .test_parallel import near_one_process, two_heads, with_plan

pytest.importorskip("ray", reason="the parallel plan's tests need Ray (requirements-dev.txt)")
pytest.importorskip("yunchang", reason="the parallel plan's tests need yunchang (requirements-dev.txt)")

UNEVEN = dict(width=48, height=48, length=1)  # 3 x 3 = 9 tokens: shards of 5 and 4 on two workers


def more_workers(comfyui, monkeypatch, workers: int) -> dict:
    """The plan's inputs for `workers` CPU workers, the CPU bound (workers at most the cores) raised for this
    test: the machine the tests run on may have fewer cores, and correctness does not need one per worker."""
    monkeypatch.setattr(comfyui.pack("nodes.parallel_nodes"), "cpu_cores", lambda: max(workers, 2))
    return dict(workers=workers, ulysses_degree=workers, devices=", ".join(["cpu"] * workers))


def alone_and_split(comfyui, prompt, **plan):
    alone = P.report_of(P.run_ok(comfyui, prompt)), P.latent_of(comfyui, "5")
    split = P.report_of(P.run_ok(comfyui, with_plan(prompt, **plan))), P.latent_of(comfyui, "5")
    return alone, split


def assert_caches_as_one_process(report, alone, workers: int):
    parallel = report["parallel"]
    for stage in ("high", "low"):
        one = alone["cache"][stage]
        assert one["cached_steps"], "the test's threshold should cache some steps"
        assert report["cache"][stage]["cached_steps"] == one["cached_steps"]
        for rank in range(workers):
            assert parallel["cached_steps"][rank][stage] == one["cached_steps"], (rank, stage)
            # the whole sequence's statistic on every rank: an unweighed average of unequal shards differs
            ranked = parallel["residual_diffs"][rank][stage]
            assert ranked.keys() == one["residual_diffs"].keys(), (rank, stage)
            assert all(abs(ranked[k] - v) <= 1e-4 for k, v in one["residual_diffs"].items()), (rank, stage, ranked)
    assert parallel["ranks_agree"]


def test_a_sequence_the_workers_do_not_divide_equals_one_process_and_caches_as_it(comfyui, tiny_models,
                                                                                 parallel_experts):
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=40, cfg=(1.0, 1.0), cache=P.CACHING,
                       **UNEVEN)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt)
    assert report["parallel"]["stage_splits"] == {"high": "ulysses", "low": "ulysses"}
    assert_caches_as_one_process(report, alone, 2)
    assert near_one_process(latent, alone_latent)
    for stage in ("high", "low"):  # rank 0 asked ComfyUI for what its shard's cache held: 5 of the 9 tokens
        one, ranked = alone["cache"][stage], report["cache"][stage]
        assert ranked["memory_asked_bytes"] == one["memory_asked_bytes"] * 5 // 9 > 0
        assert abs(ranked["memory_asked_bytes"] - ranked["held_bytes"]) <= 0.1 * ranked["held_bytes"]


def test_fewer_tokens_than_workers_are_refused_by_name(comfyui, tiny_models, parallel_experts):
    message = P.failed_at_run(comfyui, with_plan(two_heads(parallel_experts, tiny_models, width=16, height=16,
                                                           length=1)))
    assert "ulysses_degree: the video's 1 tokens" in message and "are fewer than the 2 workers" in message


@pytest.mark.slow
def test_three_workers_on_two_heads_and_a_sequence_they_do_not_divide_equal_one_process(
        comfyui, tiny_models, parallel_experts, monkeypatch):
    """Two heads over three workers (one empty head padded in) and 8 tokens (shards of 3, 3 and 2), at CFG 3.5
    (three workers do not halve: `auto` splits the sequence) and cached."""
    plan = more_workers(comfyui, monkeypatch, 3)
    prompt = two_heads(parallel_experts, tiny_models, sampler="uni_pc", steps=40, cfg=(3.5, 3.5), cache=P.CACHING)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto", **plan)
    assert report["parallel"]["workers"] == 3 and report["parallel"]["devices"] == ["cpu"] * 3
    assert report["parallel"]["stage_splits"] == {"high": "ulysses", "low": "ulysses"}
    assert_caches_as_one_process(report, alone, 3)
    assert near_one_process(latent, alone_latent)


@pytest.mark.slow
def test_four_workers_split_the_prompts_and_each_half_its_sequence_and_equal_one_process(
        comfyui, tiny_models, parallel_experts, monkeypatch):
    """A 2 x 2 mesh at CFG 3.5 (the high stage) beside Ulysses over all four at CFG 1 (the low stage), with a
    LoRA on each expert; then the same at CFG 3.5 on both stages, cached, with a sequence the halves do not
    divide (9 tokens: shards of 5 and 4)."""
    plan = more_workers(comfyui, monkeypatch, 4)
    loras = {role: parallel_experts[("lora", role)] for role in ("high", "low")}
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", cfg=(3.5, 1.0), lora=loras)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto", **plan)
    assert report["parallel"]["stage_splits"] == {"high": "cfg+ulysses", "low": "ulysses"}
    assert report["transformer_calls"] == alone["transformer_calls"] and report["loras"] == alone["loras"]
    assert near_one_process(latent, alone_latent)

    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=40, cfg=(3.5, 3.5), cache=P.CACHING,
                       **UNEVEN)
    (alone, alone_latent), (report, latent) = alone_and_split(comfyui, prompt, split="auto", **plan)
    assert report["parallel"]["stage_splits"] == {"high": "cfg+ulysses", "low": "cfg+ulysses"}
    assert_caches_as_one_process(report, alone, 4)
    assert near_one_process(latent, alone_latent)
