"""Cache-DiT on ComfyUI's own Wan model, through the real ComfyUI (in-process): a context of its own for each
expert's stage of each run (read from cache-dit itself while the run goes), with any sampler, nothing left on
the shared model afterwards, the cache off is ComfyUI's own graph, and what it cannot do right is refused."""

import json

import pytest
import torch

from wan22_cachedit.nodes import cache_dit_backend
from wan22_cachedit.nodes.core import cache as C

from .cache_state import contexts, leftovers

from .prompts import (CACHING, FINAL, RANDOM_WEIGHTS_THRESHOLD, bridged, diffusion_models, expert_files,
                      failed_at_run, latent_of, loader, native_prompt, our_prompt, report_of, run_ok, text_folder,
                      two_samplers_in_one_graph)

SMALL = dict(width=32, height=32, length=1)  # one 4x4 latent frame: long schedules stay cheap


def cached_prompt(tiny, cache=None, **run):
    return our_prompt(loader(*expert_files(tiny)), text_folder(tiny), cache={} if cache is None else cache, **run)


@pytest.mark.parametrize("runs", [
    [("euler", 40, 5.0, [17, 23]), ("euler", 40, 12.0, [26, 14])],  # two runs on the same loaded experts
    [("uni_pc", 40, 5.0, [18, 22]), ("uni_pc", 40, 12.0, [26, 14])],  # uni_pc's own sigmas: see test_nodes
    [("heun", 10, 8.0, [12, 7])],  # two evaluations per step, one on the last step to sigma 0
])
def test_each_stage_has_a_context_of_its_own_and_counts_its_experts_evaluations(comfyui, tiny_models, progress_hook,
                                                                                runs):
    executor = comfyui.new_executor()
    for sampler, steps, shift, expected in runs:
        seen = set()

        def contexts_now(value, total, node):
            models = diffusion_models(comfyui, executor=executor)
            if models:  # the loader's own progress comes before its experts exist
                seen.add(tuple((role, tuple(contexts(m))) for role, m in models.items()))

        progress_hook[:] = [contexts_now]
        result = run_ok(comfyui, cached_prompt(tiny_models, sampler=sampler, steps=steps, flow_shift=shift, **SMALL),
                        executor)
        # while each stage ran, its expert (and only it) held one context (batched CFG, cache-dit's step count
        # unset: test_a_context_sized_with_the_counted_evaluations_gives_the_same_run_bit_for_bit)
        one = ((False, None),)
        assert seen == {(("high", one), ("low", ())), (("high", ()), ("low", one))}
        report = report_of(result)
        for role, n in zip(("high", "low"), expected):
            assert report["cache"][role]["evaluations"] == n
            assert report["cache"][role]["config"].endswith("_CFG0")  # cond + uncond batched: one call each
        assert all(contexts(m) == [] for m in diffusion_models(comfyui, executor=executor).values())


EVERY_SAMPLER = "every ComfyUI sampler (slow: make test-slow)"


def comfyui_samplers():
    import comfy.samplers

    return comfy.samplers.KSampler.SAMPLERS


@pytest.mark.parametrize("samplers, separate", [
    (("euler", "heun", "uni_pc"), False),  # one, two and one evaluation per step (heun one on its last)
    (("euler", "dpmpp_sde"), True),  # ComfyUI's calls per prompt, cache-dit's separate CFG
    pytest.param(EVERY_SAMPLER, False, marks=pytest.mark.slow),
    pytest.param(EVERY_SAMPLER, True, marks=pytest.mark.slow),
])
def test_a_context_sized_with_the_counted_evaluations_gives_the_same_run_bit_for_bit(comfyui, tiny_models,
                                                                                     monkeypatch, samplers, separate):
    """Why the cache needs no table of ComfyUI's samplers: cache-dit's step count (num_inference_steps) only
    decides when a context it reuses starts again, and each stage's context is new. A run with every context
    sized with the evaluations the stage then made gives the same latent, cached steps and residual
    differences bit for bit as the run with the count unset (at a threshold that caches)."""
    import comfy.model_patcher

    backend = comfyui.pack("nodes.cache_dit_backend")
    unset_config = backend.config
    if separate:  # ComfyUI runs the prompts one call each when memory is short
        monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, device: 1024)
    differ, applied = [], []
    for sampler in comfyui_samplers() if samplers == EVERY_SAMPLER else samplers:
        prompt = cached_prompt(tiny_models, cache=dict(CACHING), sampler=sampler, steps=9, flow_shift=8.0, seed=3,
                               cfg=(3.5, 3.0), **SMALL)
        runs = []
        for sized in (None, "counted"):
            if sized:
                counted = {role: runs[0][1][role]["evaluations"] for role in ("high", "low")}

                def sized_config(plan, role, separate_cfg, installed=False):
                    config = unset_config(plan, role, separate_cfg, installed)
                    config.num_inference_steps = counted[role]
                    applied.append(sampler)
                    return config
                monkeypatch.setattr(backend, "config", sized_config)
            executor = comfyui.new_executor()
            cache = report_of(run_ok(comfyui, prompt, executor))["cache"]
            runs.append((latent_of(comfyui, FINAL["ours"], executor).clone(), cache))
            monkeypatch.setattr(backend, "config", unset_config)
        seen = {role: [(run[1][role]["cached_steps"], run[1][role]["cfg_cached_steps"],
                        run[1][role]["residual_diffs"], run[1][role]["cfg_batching"]) for run in runs]
                for role in ("high", "low")}
        assert runs[0][1]["high"]["cfg_batching"] == ("separate" if separate else "batched"), sampler
        if not (torch.equal(runs[0][0], runs[1][0]) and all(a == b for a, b in seen.values())):
            differ.append(sampler)
    assert differ == [] and set(applied) == set(comfyui_samplers() if samplers == EVERY_SAMPLER else samplers)


def test_cached_seeds_a_b_a_give_bit_identical_a_results(comfyui, tiny_models):
    latents = []
    for seed in (3, 4, 3):
        run_ok(comfyui, cached_prompt(tiny_models, steps=12, flow_shift=5.0, seed=seed))
        latents.append(latent_of(comfyui, FINAL["ours"]))
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])


def test_one_graph_two_samplers_one_cached_one_not_each_equals_its_run_alone(comfyui, tiny_models):
    cached_alone = cached_prompt(tiny_models, steps=12, seed=21)
    plain_alone = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=12, seed=21)
    expected = {}
    for key, prompt in (("cached", cached_alone), ("plain", plain_alone)):
        executor = comfyui.new_executor()
        run_ok(comfyui, prompt, executor)
        expected[key] = latent_of(comfyui, FINAL["ours"], executor)
    assert not torch.equal(expected["cached"], expected["plain"])
    first_latent, second_latent = two_samplers_in_one_graph(comfyui, cached_alone, plain_alone, comfyui.new_executor())
    assert torch.equal(first_latent, expected["cached"]) and torch.equal(second_latent, expected["plain"])
    first_latent, second_latent = two_samplers_in_one_graph(comfyui, plain_alone, cached_alone, comfyui.new_executor())
    assert torch.equal(first_latent, expected["plain"]) and torch.equal(second_latent, expected["cached"])


def test_off_after_cached_runs_is_comfyuis_own_graph_and_nothing_stays_on_the_experts(comfyui, tiny_models):
    high, low = expert_files(tiny_models)
    run = dict(sampler="uni_pc", steps=10, flow_shift=12.0, seed=2)
    executor = comfyui.new_executor()
    for seed in (1, 2):
        run_ok(comfyui, our_prompt(bridged(high, low), text_folder(tiny_models), cache={}, **{**run, "seed": seed}),
               executor)
    models = diffusion_models(comfyui, executor=executor)
    blocks = {role: m.blocks for role, m in models.items()}
    result = run_ok(comfyui, our_prompt(bridged(high, low), text_folder(tiny_models), cache={"enabled": False}, **run),
                    executor)
    assert result.outputs["20"]["text"] == ["Cache-DiT off"] and report_of(result)["cache"]["plan"] is None
    ours = latent_of(comfyui, FINAL["ours"], executor)
    for role, model in models.items():
        assert leftovers(model) == [] and model.blocks is blocks[role] and len(model.blocks) == 4
    for loader_node in ("10", "11"):  # the MODELs we received carry none of our wrappers
        assert "wrappers" not in comfyui.cached_output(loader_node, executor)[0][0].model_options.get(
            "transformer_options", {})
    switch = report_of(result)["split"]["high"]
    run_ok(comfyui, native_prompt(high, low, text_folder(tiny_models), switch=switch, **run), executor)
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"], executor))


def test_with_a_permissive_threshold_both_experts_cache_and_the_result_changes(comfyui, tiny_models):
    permissive = CACHING
    result = run_ok(comfyui, cached_prompt(tiny_models, cache=permissive, steps=12, seed=5))
    cached = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["cached_steps"] and stats["block_forwards"] < stats["block_forwards_without_cache"]
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=12, seed=5))
    assert not torch.equal(cached, latent_of(comfyui, FINAL["ours"]))
    assert "cache high:" in result.outputs["5"]["text"][0] and "% saved" in result.outputs["5"]["text"][0]


def test_the_report_shows_per_expert_what_cache_dit_did_and_with_what_settings(comfyui, tiny_models):
    result = run_ok(comfyui, cached_prompt(tiny_models, sampler="euler", steps=20, flow_shift=12.0))
    report = report_of(result)
    assert report["cache"]["plan"].startswith("high DBCache_F1B0_W4I1M0MC3_R0.24")
    assert report["split"] == {"high": 13, "low": 7}
    for role, n in (("high", 13), ("low", 7)):
        stats = report["cache"][role]
        # cond and uncond batched in one call, as ComfyUI runs them when memory allows: one step per call
        assert stats["cfg_batching"] == "batched" and stats["pass_order"] == ["negative", "positive"]  # as batched
        plan = C.CachePlan(criterion="threshold", residual_diff_threshold=RANDOM_WEIGHTS_THRESHOLD,
                           high=C.ExpertCacheSettings(4, -1), low=C.ExpertCacheSettings(2, 20))  # the prompt's
        assert stats["config"] == cache_dit_backend.describe(plan, role, False)
        assert stats["evaluations"] == n and stats["block_forwards_without_cache"] == n * 4  # 4 blocks per call
        assert set(stats["residual_diffs"]) and stats["threshold"] == 0.24
    assert result.outputs["20"]["text"][0].startswith("high DBCache_F1B0_W4")
    assert "_CFG" not in result.outputs["20"]["text"][0]  # the CFG mode is the run's: on the canvas after it
    (used,) = result.outputs["5"]["cache_used"]
    assert used["node"] == "20" and used["text"] == (f"last run: high {report['cache']['high']['config']} (positive "
                                                     f"+ negative in one call); low {report['cache']['low']['config']} "
                                                     "(positive + negative in one call)")
    node_text = result.outputs["5"]["text"][0]
    assert "of 13 steps cached" in node_text and "of 7 steps cached" in node_text


def test_at_four_steps_the_report_says_the_cache_can_skip_nothing_and_the_run_is_the_uncached_one(comfyui,
                                                                                                   tiny_models):
    run = dict(sampler="euler", steps=4, flow_shift=5.0, cfg=(1.0, 1.0))
    result = run_ok(comfyui, cached_prompt(tiny_models, **run))
    cached = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    for role in ("high", "low"):
        assert report["cache"][role]["skippable_steps"] == 0 and report["cache"][role]["cached_steps"] == []
        assert report["cache"][role]["cached"] is True  # cache-dit ran, every step in its warm-up
    assert "it could skip none of the high-noise expert's 2 steps" in result.outputs["5"]["text"][0]
    run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), **run))
    assert torch.equal(cached, latent_of(comfyui, FINAL["ours"]))


@pytest.mark.parametrize("calibrator", ["taylorseer", "dmd", "foca"])
def test_a_calibrator_forecasts_cached_steps_repeats_seeds_a_b_a_and_holds_its_memory_only_in_its_run(
        comfyui, tiny_models, calibrator):
    """Each of cache-dit's calibrators: its cached steps differ from the plain cache's (forecast, not reused), the
    same prompt for seed A, then B, then A again gives A bit for bit, its memory is in the report (held_bytes,
    more than the plain cache holds), and nothing of it is left on the experts after the run."""
    permissive = {"residual_diff_threshold": 0.9, "high_warmup_steps": 2, "low_warmup_steps": 2}
    latents, held = [], {}
    for name, seed in (("none", 6), (calibrator, 6), (calibrator, 7), (calibrator, 6)):
        executor = comfyui.new_executor()  # the same prompt twice: computed again, not served from the cache
        result = run_ok(comfyui, cached_prompt(tiny_models, cache={**permissive, "calibrator": name},
                                               steps=12, seed=seed), executor)
        report = report_of(result)["cache"]
        assert report["high"]["calibrator"] == name and report["high"]["cached_steps"]
        held[name] = report["high"]["held_bytes"]
        latents.append(latent_of(comfyui, FINAL["ours"], executor))
        for model in diffusion_models(comfyui, executor=executor).values():
            assert leftovers(model) == [] and contexts(model) == []
    assert torch.equal(latents[1], latents[3]) and not torch.equal(latents[1], latents[2])
    assert not torch.equal(latents[0], latents[1])
    assert held[calibrator] > held["none"] > 0


def test_split_cfg_batches_get_separate_cfg_contexts_and_the_runs_repeatable(comfyui, tiny_models, monkeypatch,
                                                                             progress_hook):
    """ComfyUI calls cond and uncond separately when memory is short (the free-memory estimate it batches by
    is patched here): the cache sees it at the stage's first call and pairs them with cache-dit's separate CFG,
    read from cache-dit's own context while the run goes, over the same evaluations."""
    import comfy.model_patcher

    prompt = our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), steps=10, seed=7, cfg=(4.0, 3.0))
    batched = report_of(run_ok(comfyui, prompt))
    batched_cache = report_of(run_ok(comfyui, cached_prompt(tiny_models, steps=10, seed=8)))["cache"]
    monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, device: 1024)
    split = report_of(run_ok(comfyui, prompt, comfyui.new_executor()))
    assert split["transformer_calls"]["high"] == 2 * batched["transformer_calls"]["high"]  # really split now
    latents = []
    for seed in (8, 9, 8):
        executor = comfyui.new_executor()
        seen = set()

        def contexts_now(value, total, node):
            for role, model in diffusion_models(comfyui, executor=executor).items():
                seen.update((role, config) for config in contexts(model))

        progress_hook[:] = [contexts_now]
        report = report_of(run_ok(comfyui, cached_prompt(tiny_models, steps=10, seed=seed), executor))
        latents.append(latent_of(comfyui, FINAL["ours"], executor))
        for role in ("high", "low"):
            stats = report["cache"][role]
            assert stats["cfg_batching"] == "separate" and stats["config"].endswith("_CFG1")
            assert stats["pass_order"] == ["negative", "positive"]  # ComfyUI's own order, as it called them
            assert stats["evaluations"] == batched_cache[role]["evaluations"]  # the same evaluations
            assert (role, (True, None)) in seen  # cache-dit's own context: separate CFG
            assert stats["cfg_cached_steps"] == stats["cached_steps"] != []  # both passes cached, in pairs
    assert torch.equal(latents[0], latents[2]) and not torch.equal(latents[0], latents[1])


def test_a_stage_whose_batching_changes_on_the_way_is_stopped_and_leaves_nothing_behind(comfyui, tiny_models,
                                                                                        monkeypatch):
    import comfy.model_patcher

    free = comfy.model_patcher.ModelPatcher.get_free_memory
    asked = []

    def memory_runs_short_after_the_stage_started(self, device):
        asked.append(1)
        return free(self, device) if len(asked) == 1 else 1024

    monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", memory_runs_short_after_the_stage_started)
    executor = comfyui.new_executor()
    result = comfyui.run(cached_prompt(tiny_models, steps=10, seed=3), executor=executor)
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert message.startswith("enabled: Cache-DiT cannot follow the high-noise stage: it saw a call with negative "
                              "after none in this step, where its first step had negative+positive")
    monkeypatch.undo()
    models = diffusion_models(comfyui, executor=executor)  # the experts the failed run loaded and cached on
    assert set(models) == {"high", "low"}
    for model in models.values():
        assert leftovers(model) == []


def test_an_interrupted_cached_run_leaves_no_trace_and_the_same_prompt_then_equals_a_fresh_run(comfyui, tiny_models,
                                                                                                progress_hook):
    import comfy.model_management as mm

    prompt = cached_prompt(tiny_models, steps=30, seed=12, **SMALL)
    executor = comfyui.new_executor()

    def interrupt_at_the_tenth_step(value, total, node):
        if node == "5" and value == 10:  # what POST /interrupt and the server's progress hook do
            mm.interrupt_current_processing(True)
            mm.throw_exception_if_processing_interrupted()

    progress_hook.append(interrupt_at_the_tenth_step)
    interrupted = comfyui.run(prompt, executor=executor)
    assert interrupted.valid and not interrupted.success
    assert any(event == "execution_interrupted" for event, _ in interrupted.messages)
    progress_hook.clear()
    for model in diffusion_models(comfyui, executor=executor).values():
        assert leftovers(model) == [] and contexts(model) == []
    run_ok(comfyui, prompt, executor)
    again = latent_of(comfyui, FINAL["ours"], executor)
    fresh = comfyui.new_executor()
    run_ok(comfyui, prompt, fresh)
    assert torch.equal(again, latent_of(comfyui, FINAL["ours"], fresh))


def test_a_block_patch_on_extra_evaluations_is_refused_by_name_with_the_cache_on_and_honoured_without(comfyui,
                                                                                                     tiny_models):
    """ComfyUI's own Skip Layer Guidance replaces block 1 of the high-noise expert in an extra pass (a block
    replace patch on every evaluation is honoured: test_model_patches)."""
    high, low = expert_files(tiny_models)
    slg = {"class_type": "SkipLayerGuidanceDiT",
           "inputs": {"model": ["10", 0], "double_layers": "1", "single_layers": "", "scale": 3.0,
                      "start_percent": 0.0, "end_percent": 1.0, "rescaling_scale": 0.0}}
    run = dict(sampler="euler", steps=6, flow_shift=5.0, seed=4)
    prompt = our_prompt(bridged(high, low), text_folder(tiny_models), cache={}, **run)
    prompt["9"] = slg
    prompt["1"]["inputs"]["high_noise_model"] = ["9", 0]
    message = failed_at_run(comfyui, prompt)
    assert message.startswith("enabled: the high-noise expert carries per-block model patches")
    assert "patches_replace dit double_block 1) on some of its evaluations only" in message
    assert "Wan2.2 Cache-DiT node" in message
    prompt["20"]["inputs"]["enabled"] = False
    result = run_ok(comfyui, prompt)
    ours = latent_of(comfyui, FINAL["ours"])
    native = native_prompt(high, low, text_folder(tiny_models), switch=report_of(result)["split"]["high"], **run)
    native["9"] = slg
    native["14"]["inputs"]["model"] = ["9", 0]
    run_ok(comfyui, native)
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_an_adaptive_sampler_runs_cached_and_its_report_counts_the_evaluations_it_chose(comfyui, tiny_models):
    """dpm_adaptive picks its step sizes as it goes: the cache needs no count of them before the run."""
    result = run_ok(comfyui, cached_prompt(tiny_models, cache=dict(CACHING), sampler="dpm_adaptive", steps=6,
                                           **SMALL))
    report = report_of(result)
    for role in ("high", "low"):
        assert report["cache"][role]["cached"] is True
        assert report["cache"][role]["evaluations"] == report["transformer_calls"][role] > 0


def test_the_cache_node_returns_a_new_handle_and_leaves_the_loaders_alone(comfyui, tiny_models):
    run_ok(comfyui, cached_prompt(tiny_models, cache={"residual_diff_threshold": 0.1}, steps=4))
    loaded, cached = comfyui.cached_output("1")[0][0], comfyui.cached_output("20")[0][0]
    assert loaded.cache_plan is None and cached.cache_plan.residual_diff_threshold == 0.1
    assert cached.high is loaded.high


def test_a_plan_the_experts_cannot_take_is_an_error_naming_the_input(comfyui, tiny_models):
    message = failed_at_run(comfyui, cached_prompt(tiny_models, cache={"first_compute_blocks": 4}, steps=4))
    assert "first_compute_blocks:" in message and "these experts have 4 layers" in message


def test_a_prompt_saved_without_the_calibrator_input_still_runs(comfyui, tiny_models):
    prompt = cached_prompt(tiny_models, steps=6)
    del prompt["20"]["inputs"]["calibrator"]
    assert json.loads(run_ok(comfyui, prompt).outputs["6"]["text"][0])["cache"]["high"]["calibrator"] == "none"


@pytest.mark.parametrize("calibrator", C.CALIBRATORS)
def test_the_report_gives_the_memory_cache_dit_held_per_expert(comfyui, tiny_models, calibrator):
    """Two hidden-state-sized tensors per prompt stream (the first blocks' output it compares and the rest's
    residual it reuses) at F1 B0 without a calibrator; a calibrator holds its states besides, at most
    C.HELD_PER_STREAM of them once it has forecast (DMD's fit in complex128): what docs/stack.md's sizes and the
    calibrator's tooltip use."""
    run = dict(steps=30, seed=5, width=64, height=48, length=5)  # 2 latent frames of 6 x 8: 24 tokens
    tokens, width = 2 * (48 // 16) * (64 // 16), 128
    unit = 2 * tokens * width * 4  # one fp32 tensor of the hidden state's size for each of positive and negative
    cache = {"calibrator": calibrator, "criterion": "threshold", "residual_diff_threshold": 0.9}
    report = report_of(run_ok(comfyui, cached_prompt(tiny_models, cache=cache, **run)))
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["cfg_batching"] == "batched" and stats["held_on"] == ["cpu"] and stats["cached_steps"]
        assert stats["held_bytes"] <= C.HELD_PER_STREAM[calibrator] * unit * 1.01
    most = max(report["cache"][role]["held_bytes"] for role in ("high", "low"))
    assert most >= C.HELD_PER_STREAM[calibrator] * unit
