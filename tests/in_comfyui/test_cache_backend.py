"""The stage observer and the cache method apart: the pack's sampler on the real ComfyUI with a recording double
in place of cache_dit_backend (StageCache.backend). It shows what another cache method has to answer, and that
the observer alone changes nothing of the run: it asks for install when a stage starts, a refresh with
separate CFG when ComfyUI runs the prompts one call each, removal when the stage ends and after an error, and
the first error is the one reported when removal fails too."""

import logging

import pytest
import torch

from .prompts import FINAL, expert_files, latent_of, loader, our_prompt, report_of, run_ok, text_folder

SMALL = dict(width=32, height=32, length=1)
RUN = dict(sampler="euler", steps=8, flow_shift=5.0, seed=5, cfg=(3.5, 3.0), **SMALL)


class RecordingBackend:
    """A cache method that caches nothing and writes down what the observer asks of it."""

    NOTHING = {"cached_steps": [], "cfg_cached_steps": [], "residual_diffs": {}}

    def __init__(self, fail_removal: bool = False):
        self.events, self.on, self.fail_removal = [], set(), fail_removal

    def describe(self, plan, role, separate_cfg=None):
        return f"RECORDING_{role}" + ("" if separate_cfg is None else f"_CFG{int(separate_cfg)}")

    def describe_plan(self, plan):
        return "recording"

    def is_cached(self, diffusion_model):
        return id(diffusion_model) in self.on

    def install(self, diffusion_model, plan, role, separate_cfg):
        self.events.append(("install", role, separate_cfg))
        self.on.add(id(diffusion_model))

    def refresh(self, diffusion_model, plan, role, separate_cfg):
        self.events.append(("refresh", role, separate_cfg))

    def remove(self, diffusion_model):
        self.events.append(("remove",))
        self.on.discard(id(diffusion_model))
        if self.fail_removal:
            raise RuntimeError("the double's removal failed")

    def outcome(self, diffusion_model):
        return {"cached_steps": [], "cfg_cached_steps": [], "residual_diffs": {"1": 0.5}}

    def held(self, diffusion_model):
        return {"bytes": 7, "devices": ["cpu"]}


@pytest.fixture
def recording(comfyui, monkeypatch):
    def swap(**kwargs):
        backend = RecordingBackend(**kwargs)
        monkeypatch.setattr(comfyui.pack("nodes.stage_cache").StageCache, "backend", backend)
        return backend
    return swap


def prompt(tiny, cache=None):
    return our_prompt(loader(*expert_files(tiny)), text_folder(tiny), cache=cache, **RUN)


def test_the_observer_drives_a_double_per_stage_and_alone_changes_nothing(comfyui, tiny_models, recording):
    plain = comfyui.new_executor()
    run_ok(comfyui, prompt(tiny_models), plain)
    uncached = latent_of(comfyui, FINAL["ours"], plain)
    backend = recording()
    executor = comfyui.new_executor()
    report = report_of(run_ok(comfyui, prompt(tiny_models, cache={}), executor))
    assert backend.events == [("install", "high", False), ("remove",), ("install", "low", False), ("remove",)]
    assert torch.equal(latent_of(comfyui, FINAL["ours"], executor), uncached)
    assert report["cache"]["plan"] == "recording"
    for role in ("high", "low"):
        stats = report["cache"][role]
        assert stats["config"] == f"RECORDING_{role}_CFG0" and stats["cfg_batching"] == "batched"
        assert stats["residual_diffs"] == {"1": 0.5} and stats["held_bytes"] == 7 and stats["held_on"] == ["cpu"]
        assert stats["evaluations"] == report["transformer_calls"][role]


def test_separate_prompts_ask_the_double_for_a_separate_cfg_context(comfyui, tiny_models, recording, monkeypatch):
    import comfy.model_patcher

    monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, device: 1024)
    backend = recording()
    report = report_of(run_ok(comfyui, prompt(tiny_models, cache={}), comfyui.new_executor()))
    assert backend.events == [("install", "high", False), ("refresh", "high", True), ("remove",),
                              ("install", "low", False), ("refresh", "low", True), ("remove",)]
    assert report["cache"]["high"]["config"] == "RECORDING_high_CFG1"


@pytest.mark.parametrize("fail_removal", [False, True])
def test_an_interrupted_stage_removes_the_double_and_its_error_is_the_one_reported(comfyui, tiny_models, recording,
                                                                                   progress_hook, caplog, fail_removal):
    import comfy.model_management as mm

    backend = recording(fail_removal=fail_removal)

    def interrupt_after_the_first_step(value, total, node):
        if node == "5" and value == 1:
            mm.interrupt_current_processing(True)
            mm.throw_exception_if_processing_interrupted()

    progress_hook.append(interrupt_after_the_first_step)
    caplog.set_level(logging.ERROR)
    interrupted = comfyui.run(prompt(tiny_models, cache={}), executor=comfyui.new_executor())
    progress_hook.clear()
    assert interrupted.valid and not interrupted.success
    assert any(event == "execution_interrupted" for event, _ in interrupted.messages)  # not the removal's error
    assert backend.events == [("install", "high", False), ("remove",)] and backend.on == set()
    assert any("removing the cache after the high-noise stage's error also failed" in r.getMessage()
               for r in caplog.records) == fail_removal
    backend.fail_removal = False
    backend.events.clear()
    run_ok(comfyui, prompt(tiny_models, cache={}), comfyui.new_executor())  # the next run as if nothing happened
    assert backend.events == [("install", "high", False), ("remove",), ("install", "low", False), ("remove",)]
