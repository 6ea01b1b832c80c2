"""Wan2.2 Cache-DiT (MODEL) in the official template's graph of ComfyUI's own samplers: each KSamplerAdvanced's
sample call gets a context of its own (read from cache-dit while it runs), the node off is
the template bit for bit, nothing stays on the models, and it gives what our sampler gives with the same plan."""

import logging

import pytest
import torch

from wan22_cachedit.nodes.core.cache import CachePlan, ExpertCacheSettings

from .cache_state import contexts, leftovers
from .prompts import (FINAL, RANDOM_WEIGHTS_CACHE, expert_files, latent_of, loader, native_prompt, our_prompt,
                      report_of, run_ok, text_folder, with_model_caches)

SMALL = dict(width=32, height=32, length=1)
TEMPLATE = dict(sampler="euler", scheduler="simple", steps=20, flow_shift=5.0, cfg=(3.5, 3.5), **SMALL)
PERMISSIVE = {"residual_diff_threshold": 0.8}  # random weights: a high threshold so that steps are cached


def unet_models(comfyui, executor=None) -> dict:
    """The diffusion models of the template's two UNETLoaders ("10", "11") that have run: what every clone
    runs."""
    outputs = {role: comfyui.cached_output(node, executor) for role, node in (("high", "10"), ("low", "11"))}
    return {role: out[0][0].model.diffusion_model for role, out in outputs.items() if out is not None}


def template(tiny, switch, **run):
    return native_prompt(*expert_files(tiny), text_folder(tiny), switch=switch, **{**TEMPLATE, **run})


@pytest.mark.parametrize("switch, expected", [
    (10, [10, 10]),  # the split the template types: steps 0-10 and 10-20
    (9, [9, 11]),  # the split the boundary 0.875 gives on these sigmas (our schedule's)
])
def test_each_ksampleradvanced_gets_a_context_of_its_own(comfyui, tiny_models, progress_hook, caplog, switch,
                                                         expected):
    caplog.set_level(logging.INFO)
    executor = comfyui.new_executor()
    seen = set()

    def contexts_now(value, total, node):
        models = unet_models(comfyui, executor)
        seen.add(tuple((role, tuple(contexts(models[role])) if role in models else ())
                       for role in ("high", "low")))

    progress_hook[:] = [contexts_now]
    run_ok(comfyui, with_model_caches(template(tiny_models, switch), high={}, low={}), executor)
    # each sampler's call held one context (batched CFG) on its expert, and nothing else was cached
    one = ((False, None),)
    assert {(("high", one), ("low", ())), (("high", ()), ("low", one))} <= seen
    assert seen <= {(("high", one), ("low", ())), (("high", ()), ("low", one)), (("high", ()), ("low", ()))}
    assert all(leftovers(m) == [] for m in unet_models(comfyui, executor).values())
    # and counted its own evaluations (the node's line in the log, as on the canvas)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Wan2.2 Cache-DiT (MODEL) 6")]
    assert [line.split(" of ")[1].split(" ")[0] for line in lines] == [str(n) for n in expected], lines


def test_the_boundary_split_is_the_one_our_schedule_counts(comfyui, tiny_models):
    result = run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models),
                                        **{**TEMPLATE, "cfg": (3.5, 3.5)}))
    assert report_of(result)["split"] == {"high": 9, "low": 11}


def test_a_b_a_bit_identical_and_off_is_the_template_bit_for_bit(comfyui, tiny_models):
    def cached(seed, enabled=True):
        prompt = with_model_caches(template(tiny_models, 10, seed=seed), high={**PERMISSIVE, "enabled": enabled},
                                   low={**PERMISSIVE, "enabled": enabled})
        result = run_ok(comfyui, prompt)
        return latent_of(comfyui, FINAL["native"]), result

    a, result = cached(1)
    b, _ = cached(2)
    a_again, _ = cached(1)
    assert torch.equal(a, a_again) and not torch.equal(a, b)
    run_ok(comfyui, template(tiny_models, 10, seed=1))
    plain = latent_of(comfyui, FINAL["native"])
    assert not torch.equal(a, plain)  # the cache did serve steps
    off, _ = cached(1, enabled=False)
    assert torch.equal(off, plain)
    assert all(leftovers(m) == [] for m in unet_models(comfyui).values())


def test_our_sampler_and_the_model_node_with_the_same_plan_give_the_same_latent(comfyui, tiny_models):
    plan = CachePlan(high=ExpertCacheSettings(RANDOM_WEIGHTS_CACHE["high_warmup_steps"], -1),
                     low=ExpertCacheSettings(RANDOM_WEIGHTS_CACHE["low_warmup_steps"], 20))
    result = run_ok(comfyui, our_prompt(loader(*expert_files(tiny_models)), text_folder(tiny_models), seed=4,
                                        cache=PERMISSIVE, **TEMPLATE))
    ours = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    assert report["cache"]["high"]["cached_steps"] and report["cache"]["low"]["cached_steps"]
    per_role = {role: {"warmup_steps": plan.settings(role).warmup_steps,
                       "max_cached_steps": plan.settings(role).max_cached_steps, **PERMISSIVE}
                for role in ("high", "low")}
    run_ok(comfyui, with_model_caches(template(tiny_models, report["split"]["high"], seed=4), **per_role))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_the_model_node_and_the_samplers_cache_on_one_expert_are_refused_and_leave_nothing(comfyui, tiny_models):
    from .prompts import bridged, cache_model_node

    high, low = expert_files(tiny_models)
    prompt = our_prompt(bridged(high, low), text_folder(tiny_models), cache={}, steps=12, **SMALL)
    prompt["60"] = cache_model_node(["10", 0], warmup_steps=0)
    prompt["1"]["inputs"]["high_noise_model"] = ["60", 0]
    executor = comfyui.new_executor()
    result = comfyui.run(prompt, executor=executor)
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert "is already cached by another Cache-DiT node" in message and "keep one of them" in message
    assert message.startswith("experts: ")  # the input of the node that failed: the sampler's (fuzz-found)
    models = unet_models(comfyui, executor)
    assert models and all(leftovers(m) == [] for m in models.values())


def test_the_model_node_in_a_stack_honours_an_attention_override_and_refuses_another_cache(comfyui, tiny_models,
                                                                                         probe_nodes):
    """The MODEL node shares the sampler's stage lifecycle: the same block indices and the same refusals."""
    from .prompts import on_each_expert

    never = {"residual_diff_threshold": 0.001, "warmup_steps": 1}
    native = on_each_expert(template(tiny_models, 9), "Wan22TestRecordAttention")
    run_ok(comfyui, native)
    expected = latent_of(comfyui, FINAL["native"])
    assert {index for _, index, _ in probe_nodes["attention"]} == {0, 1, 2, 3}
    probe_nodes["attention"].clear()
    run_ok(comfyui, with_model_caches(native, high=never, low=never))
    assert torch.equal(latent_of(comfyui, FINAL["native"]), expected)
    assert {index for _, index, _ in probe_nodes["attention"]} == {0, 1, 2, 3}
    easy = on_each_expert(template(tiny_models, 9), "EasyCache", reuse_threshold=0.2, start_percent=0.15,
                          end_percent=0.95, verbose=False)
    result = comfyui.run(with_model_caches(easy, high={}, low={}), executor=comfyui.new_executor())
    assert result.valid and not result.success
    message = result.execution_error()["exception_message"]
    assert message.startswith("enabled: the MODEL is also run by ComfyUI's EasyCache or LazyCache")
    assert "set enabled to false on the Wan2.2 Cache-DiT (MODEL) node" in message


def test_a_forecast_is_not_carried_across_a_change_of_the_attention_route(comfyui, tiny_models, probe_nodes):
    """A newer ComfyUI's attention nodes publish the route each call takes (attention_backend_history_v1; a
    stand-in policy here): with TaylorSeer, the evaluation where the route changes starts a fresh forecast
    (computed, its calibrator empty); a route that holds changes nothing; a route nobody vouches for is never
    forecast."""
    from .prompts import model_node_statistics, on_each_expert

    taylor = {"criterion": "threshold", "residual_diff_threshold": 0.9, "warmup_steps": 1, "calibrator": "taylorseer"}

    def run(mode=None, sigma=0.0):
        prompt = template(tiny_models, 10)
        if mode is not None:
            prompt = on_each_expert(prompt, "Wan22TestRouteHistory", mode=mode, sigma=sigma)
        executor = comfyui.new_executor()
        probe_nodes["route"].clear()
        run_ok(comfyui, with_model_caches(prompt, high=taylor, low=taylor), executor)
        stats = {role: model_node_statistics(comfyui, shift_id, executor)
                 for role, shift_id in (("high", "14"), ("low", "15"))}
        return latent_of(comfyui, FINAL["native"], executor), stats, list(probe_nodes["route"])

    plain, plain_stats, _ = run()
    assert plain_stats["high"]["cached_steps"] and "fresh_forecasts" not in plain_stats["high"]
    same, same_stats, asked = run("same")
    assert torch.equal(same, plain) and same_stats == plain_stats  # a route that holds changes nothing
    assert len(asked) == plain_stats["high"]["evaluations"] + plain_stats["low"]["evaluations"]
    assert {tokens for _, _, tokens in asked} == {2 * 2}  # the layout: one 4 x 4 latent frame in 2 x 2 patches
    high_sigmas = [sigma for sigma, _, _ in asked[:plain_stats["high"]["evaluations"]]]
    switch = (high_sigmas[4] + high_sigmas[5]) / 2  # dense for the high stage's first five evaluations
    switched, switched_stats, _ = run("switch", switch)
    assert switched_stats["high"]["fresh_forecasts"] == [5] and 5 not in switched_stats["high"]["cached_steps"]
    assert "fresh_forecasts" not in switched_stats["low"]  # sparse throughout
    assert switched_stats["high"]["cached_steps"] and not torch.equal(switched, plain)
    _, vouched_later, _ = run("none_then_dense", switch)  # the first vouched route starts afresh too
    assert vouched_later["high"]["fresh_forecasts"] == [0, 1, 2, 3, 4, 5]
    assert min(vouched_later["high"]["cached_steps"]) > 5
    _, unvouched, _ = run("none")
    for role in ("high", "low"):
        assert unvouched[role]["cached_steps"] == []
        assert unvouched[role]["fresh_forecasts"] == list(range(unvouched[role]["evaluations"]))
