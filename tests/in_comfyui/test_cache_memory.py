"""The cache's memory through ComfyUI's own memory management: before a cached stage samples, the bytes its cache
will hold are in what ComfyUI's prepare_sampling asks load_models_gpu to make room for (recorded here), they are
what the cache then held, nothing is asked with the cache off, and nothing of it stays on the shared model."""

import pytest

from .prompts import (cache_node, expert_files, loader, model_node_statistics, native_prompt, our_prompt, report_of,
                      run_ok, text_folder, with_model_caches)

THRESHOLD = {"criterion": "threshold", "residual_diff_threshold": 0.9, "high_warmup_steps": 1,
             "low_warmup_steps": 1}  # caches on these random experts


@pytest.fixture
def asked(monkeypatch):
    """What each sampling's prepare_sampling asked ComfyUI's model management for, in order: (memory_required,
    minimum_memory_required) of each load_models_gpu call that loads a Wan expert."""
    import comfy.model_management
    from comfy.ldm.wan.model import WanModel

    calls, load = [], comfy.model_management.load_models_gpu

    def recording(models, memory_required=0, *args, **kwargs):
        if any(isinstance(getattr(getattr(m, "model", None), "diffusion_model", None), WanModel) for m in models):
            calls.append((memory_required, kwargs.get("minimum_memory_required")))
        return load(models, memory_required, *args, **kwargs)
    monkeypatch.setattr(comfy.model_management, "load_models_gpu", recording)
    return calls


def prompt(tiny, cache, size, seed, cfg=(4.0, 3.0), steps=30):
    p = our_prompt(loader(*expert_files(tiny)), text_folder(tiny), steps=steps, seed=seed, cfg=cfg, cache=None,
                   width=size[0], height=size[1], length=5)
    if cache is not None:
        p["20"] = cache_node("1", **cache)
        p["5"]["inputs"]["experts"] = ["20", 0]
    return p


@pytest.mark.parametrize("separate", [False, True])
def test_comfyui_makes_room_for_the_bytes_the_cache_then_holds(comfyui, tiny_models, asked, monkeypatch, separate):
    import comfy.model_patcher

    if separate:  # ComfyUI runs the prompts one at a time when memory is short
        monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, device: 1024)
    seed = 40 + separate
    for size in ((64, 48),) if separate else ((64, 48), (96, 64)):
        del asked[:]  # ComfyUI's estimate depends on the latent's shape, not on the steps: the uncached runs are short
        run_ok(comfyui, prompt(tiny_models, None, size, seed, steps=10))  # no cache node: what ComfyUI asks by itself
        run_ok(comfyui, prompt(tiny_models, {**THRESHOLD, "enabled": False}, size, seed + 1, steps=10))
        native, off = asked[0:2], asked[2:4]
        assert len(native) == 2 and off == native  # each run's two stages; the cache off asks for nothing extra
        tokens = 2 * (size[1] // 16) * (size[0] // 16)
        for calibrator, steps in (("none", 10), ("taylorseer", 30)):  # TaylorSeer's states fill over a few steps
            del asked[:]
            cached = report_of(run_ok(comfyui, prompt(tiny_models, {**THRESHOLD, "calibrator": calibrator}, size,
                                                      seed + 2, steps=steps)))["cache"]
            for (base, base_min), (more, more_min), role in zip(native, asked, ("high", "low"), strict=True):
                stats = cached[role]
                assert stats["cfg_batching"] == ("separate" if separate else "batched") and stats["cached_steps"]
                extra = stats["memory_asked_bytes"]
                assert more - base == pytest.approx(extra) and more_min - base_min == pytest.approx(extra)
                # two prompt streams of the hidden state (tokens x 128, fp32), and what the cache then held (its
                # calibrator's states fill as the stage computes: a stage of a few steps holds less)
                assert extra == (5 if calibrator == "taylorseer" else 2) * 2 * tokens * 128 * 4
                assert abs(extra - stats["held_bytes"]) <= 0.1 * stats["held_bytes"], (extra, stats["held_bytes"])


def test_at_cfg_1_one_prompt_stream_is_asked_for_and_the_shared_model_keeps_its_own_estimate(comfyui, tiny_models,
                                                                                             asked):
    cached = report_of(run_ok(comfyui, prompt(tiny_models, THRESHOLD, (64, 48), 50, cfg=(1.0, 1.0))))["cache"]
    for role in ("high", "low"):
        stats = cached[role]
        assert stats["cfg_batching"] == "single" and stats["cached_steps"]
        assert stats["memory_asked_bytes"] == 2 * 1 * 24 * 128 * 4  # one prompt stream: the negative is not run
        assert abs(stats["memory_asked_bytes"] - stats["held_bytes"]) <= 0.1 * stats["held_bytes"]
    for role, model in experts_of(comfyui).items():  # the estimate raised for prepare_sampling only
        assert "memory_required" not in vars(model.model), role
        assert model.model.memory_required([2, 16, 2, 6, 8]) == type(model.model).memory_required(
            model.model, [2, 16, 2, 6, 8])


def experts_of(comfyui, node="1") -> dict:
    return comfyui.cached_output(node)[0][0].models()


def test_the_model_node_in_the_templates_graph_asks_for_its_bytes_too(comfyui, tiny_models, asked):
    """Each KSamplerAdvanced's prepare_sampling on a MODEL with the Cache-DiT (MODEL) node asks for what that
    sample call's cache holds; without the node, what ComfyUI asks by itself."""
    native = native_prompt(*expert_files(tiny_models), text_folder(tiny_models), switch=6, steps=12, seed=70,
                           width=64, height=48, length=5)
    run_ok(comfyui, native)
    alone = list(asked)
    del asked[:]
    settings = {"criterion": "threshold", "residual_diff_threshold": 0.9, "warmup_steps": 1}
    run_ok(comfyui, with_model_caches(native, high=settings, low=settings))
    assert len(alone) == len(asked) == 2
    for (base, base_min), (more, more_min), shift_id in zip(alone, asked, ("14", "15"), strict=True):
        stats = model_node_statistics(comfyui, shift_id)
        assert stats["cached_steps"] and stats["memory_asked_bytes"] > 0
        assert more - base == pytest.approx(stats["memory_asked_bytes"])
        assert more_min - base_min == pytest.approx(stats["memory_asked_bytes"])
        assert abs(stats["memory_asked_bytes"] - stats["held_bytes"]) <= 0.1 * stats["held_bytes"]
