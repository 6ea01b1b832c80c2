"""More than two stages: the three-stage LightX2V recipe (a lead stage on the high-noise expert without the
LoRAs, on a finer schedule of its own), sigma-aligned and bit-identical to the graphs people build by hand
with ComfyUI's own nodes."""

import torch

from wan22_cachedit.nodes import cache_dit_backend

from .cache_state import leftovers
from .prompts import (FINAL, diffusion_models, latent_of, native_three_ksamplers, report_of, run_ok,
                      three_stage_prompt)

SMALL = dict(width=32, height=32, length=1)


def test_three_stages_equal_three_ksampleradvanced_where_the_sigmas_line_up(comfyui, tiny_models):
    """Shift 5, lead 24 steps running 0 to 3, main 8 steps from step 1, boundary 0.875, CFG 3.5 / 1 / 1, the
    LoRAs on stages 2 and 3: euler/simple's 24-step sigma 3 is its 8-step sigma 1, bit for bit."""
    result = run_ok(comfyui, three_stage_prompt(tiny_models, seed=3, **SMALL))
    ours = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    assert report["split"] == {"lead": 3, "high": 3, "low": 4}
    assert report["lead"]["hand_off_exact"] is True
    assert report["stage_per_step"] == ["lead"] * 3 + ["high"] * 3 + ["low"] * 4
    assert report["cfg"] == {"high": 1.0, "low": 1.0, "lead": 3.5}
    assert report["transformer_calls"] == {"lead": 3, "high": 3, "low": 4}
    assert report["forward_passes"]["lead"] == 6  # CFG 3.5: positive and negative
    run_ok(comfyui, native_three_ksamplers(tiny_models, switch=4, seed=3, **SMALL))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


def test_where_no_lead_sigma_is_the_main_start_the_lead_ends_on_it_as_samplercustomadvanced_would(comfyui,
                                                                                                    tiny_models):
    """normal scheduler: the 24-step schedule has no sigma equal to the 8-step one's step 1, so the lead's last
    step goes from its last sigma above it to it; the native graph runs the lead through SamplerCustomAdvanced
    on those sigmas, and the main stages through the template's KSamplerAdvanced."""
    run = dict(scheduler="normal", seed=5, **SMALL)
    prompt = three_stage_prompt(tiny_models, **run)
    result = run_ok(comfyui, prompt)
    ours = latent_of(comfyui, FINAL["ours"])
    report = report_of(result)
    lead = report["lead"]
    assert lead["hand_off_exact"] is False and "a step of its own size" in lead["hand_off"]
    assert lead["hand_off"] in result.outputs["41"]["text"][0]  # the node text says how the hand-off is made
    switch = 1 + report["split"]["high"]

    native = native_three_ksamplers(tiny_models, switch=switch, **run)
    lead_ksampler = native.pop("20")["inputs"]
    native.update({
        "41": prompt["41"], "2": prompt["2"], "1": prompt["1"],  # our lead node, for its sigmas only
        "50": {"class_type": "BasicScheduler", "inputs": {"model": ["21", 0], "scheduler": "normal", "steps": 24,
                                                          "denoise": 1.0}},
        "51": {"class_type": "BasicScheduler", "inputs": {"model": ["14", 0], "scheduler": "normal", "steps": 8,
                                                          "denoise": 1.0}},
        "52": {"class_type": "RandomNoise", "inputs": {"noise_seed": lead_ksampler["noise_seed"]}},
        "53": {"class_type": "CFGGuider", "inputs": {"model": ["21", 0], "positive": ["3", 0], "negative": ["3", 1],
                                                     "cfg": 3.5}},
        "54": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "20": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["52", 0], "guider": ["53", 0],
                                                                  "sampler": ["54", 0], "sigmas": ["41", 1],
                                                                  "latent_image": ["4", 0]}},
        "55": {"class_type": "PreviewAny", "inputs": {"source": ["50", 0]}},
        "56": {"class_type": "PreviewAny", "inputs": {"source": ["51", 0]}},
    })
    run_ok(comfyui, native)
    lead_24, main_8 = comfyui.cached_output("50")[0][0], comfyui.cached_output("51")[0][0]
    end = lead["end_step"]
    assert end == 4 and lead_24[end] != main_8[1]
    # the lead's sigmas: ComfyUI's own 24-step ones down to the last above the main start, then that start
    assert torch.equal(comfyui.cached_output("41")[1][0], torch.cat([lead_24[:end], main_8[1:2]]))
    assert torch.equal(ours, latent_of(comfyui, FINAL["native"]))


CACHED = {"residual_diff_threshold": 0.8, "high_warmup_steps": 1, "low_warmup_steps": 1, "low_max_cached_steps": -1}
CACHED_RUN = dict(steps=16, lead_steps=48, start_step=2, **SMALL)


def test_three_stages_with_the_cache_get_three_contexts_each_fresh(comfyui, tiny_models, progress_hook):
    """The high-noise expert runs two stages (with and without the LoRA): each gets a context of its own,
    whose step count starts again at 1; A-B-A holds."""
    executor = comfyui.new_executor()
    seen = []

    def contexts_now(value, total, node):
        models = diffusion_models(comfyui, executor=executor)
        for role, module in models.items():
            held = cache_dit_backend.contexts(module)
            if held:
                (context,) = held
                seen.append((role, context["executed"]))

    progress_hook[:] = [contexts_now]
    result = run_ok(comfyui, three_stage_prompt(tiny_models, cache=CACHED, seed=1, **CACHED_RUN), executor)
    a = latent_of(comfyui, FINAL["ours"], executor)
    report = report_of(result)
    split = report["split"]
    assert all(split[stage] > 1 for stage in ("lead", "high", "low"))
    expected = [("high", i) for i in range(1, split["lead"] + 1)]  # each stage's context counts from 1 again
    expected += [("high", i) for i in range(1, split["high"] + 1)]
    expected += [("low", i) for i in range(1, split["low"] + 1)]
    assert seen == expected
    for stage in ("lead", "high", "low"):
        assert report["cache"][stage]["evaluations"] == split[stage] and report["cache"][stage]["cached"] is True
    assert any(report["cache"][stage]["cached_steps"] for stage in ("lead", "high", "low"))
    assert all(leftovers(m) == [] for m in diffusion_models(comfyui, executor=executor).values())

    run_ok(comfyui, three_stage_prompt(tiny_models, cache=CACHED, seed=2, **CACHED_RUN), executor)
    b = latent_of(comfyui, FINAL["ours"], executor)
    run_ok(comfyui, three_stage_prompt(tiny_models, cache=CACHED, seed=1, **CACHED_RUN), executor)
    assert torch.equal(a, latent_of(comfyui, FINAL["ours"], executor)) and not torch.equal(a, b)


def test_a_lead_stage_left_with_nothing_to_cache_caches_nothing_and_says_why(comfyui, tiny_models):
    result = run_ok(comfyui, three_stage_prompt(tiny_models, cache={}, seed=1, **SMALL))
    lead = report_of(result)["cache"]["lead"]
    assert lead["cached"] is True and lead["evaluations"] == 3 and lead["cached_steps"] == []
    assert lead["note"].startswith("cached nothing") and "high_warmup_steps" in lead["note"]
    assert "cache lead:" in result.outputs["5"]["text"][0]
