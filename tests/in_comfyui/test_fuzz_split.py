"""The split, fuzzed: for generated sampler x scheduler x steps x flow shift x boundary x experts, the schedule
node's split equals the one counted from the sigmas ComfyUI's own KSampler computes on the shifted expert
(ModelSamplingSD3, as the official template does), and the live route answers the same split."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .prompts import bridged, expert_files, run_ok, schedule_prompt, split_of


def ksampler_split(comfyui, model, sampler, scheduler, steps, shift, boundary, experts) -> tuple[int, int]:
    """High-noise steps, low-noise steps of the steps KSampler's own sigmas have: the high-noise expert takes
    the steps from the first while their sigma is at or above the boundary; one expert alone takes them all."""
    import comfy.samplers
    import comfy_extras.nodes_model_advanced as advanced

    shifted = advanced.ModelSamplingSD3().patch(model, shift)[0]
    sigmas = comfy.samplers.KSampler(shifted, steps, "cpu", sampler, scheduler, denoise=1.0).sigmas.tolist()
    steps = len(sigmas) - 1  # what KSampler steps through (ddim_uniform: not always the steps asked)
    if experts != "both":
        return (steps, 0) if experts == "high" else (0, steps)
    high = 0
    while high < steps and sigmas[high] >= boundary:
        high += 1
    return high, steps - high


@pytest.fixture(scope="module")
def choices(comfyui):
    import comfy.samplers

    return comfy.samplers.KSampler.SAMPLERS, comfy.samplers.KSampler.SCHEDULERS


@pytest.mark.fuzz_examples(300, 1500)
def test_the_split_is_the_one_ksampler_sigmas_give_on_the_node_and_the_route(comfyui, tiny_models, tiny_models_server,
                                                                             choices, examples, fuzz_tally):
    samplers, schedulers = choices
    files = {task: expert_files(tiny_models, task) for task in ("t2v", "i2v")}
    defaults = {"t2v": 0.875, "i2v": 0.9}
    models = {}

    @settings(max_examples=examples)
    @given(sampler=st.sampled_from(samplers), scheduler=st.sampled_from(schedulers), steps=st.integers(1, 60),
           shift=st.floats(0.01, 100.0) | st.sampled_from([0.01, 1.0, 3.0, 5.0, 8.0, 12.0, 100.0]),
           ratio=st.none() | st.floats(0.0, 1.0) | st.sampled_from([0.0, 0.5, 0.875, 0.9, 1.0]),
           task=st.sampled_from(["t2v", "i2v"]), experts=st.sampled_from(["both", "both", "high", "low"]))
    def check(sampler, scheduler, steps, shift, ratio, task, experts):
        high, low = files[task]
        graph = bridged(high=high if experts != "low" else None, low=low if experts != "high" else None)
        boundary = {"boundary": "auto"} if ratio is None else {"boundary": "custom", "boundary_ratio": ratio}
        prompt = schedule_prompt(graph, sampler=sampler, scheduler=scheduler, steps=steps, flow_shift=shift,
                                 **boundary)
        ours = split_of(run_ok(comfyui, prompt))
        loader = "10" if experts != "low" else "11"
        if (task, loader) not in models:
            models[(task, loader)] = comfyui.cached_output(loader)[0][0]
        expected = ksampler_split(comfyui, models[(task, loader)], sampler, scheduler, steps, shift,
                                  defaults[task] if ratio is None else ratio, experts)
        assert ours == expected, (sampler, scheduler, steps, shift, ratio, task, experts)
        status, answer = tiny_models_server.post("/wan22/split", {"prompt": prompt, "nodes": ["2"]})
        assert status == 200, answer
        assert (answer["splits"]["2"]["high"], answer["splits"]["2"]["low"]) == ours
        fuzz_tally(f"{experts} expert(s)" if experts != "both" else "both experts")
    check()
