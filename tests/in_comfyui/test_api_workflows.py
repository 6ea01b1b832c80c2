"""The shipped API-format workflows, posted to a real server's /prompt with tiny stand-in files."""

import copy
import json
import os

import pytest

from devtools.comfy_server import run_prompt
from devtools.paths import ROOT
from devtools.workflow_specs import NEGATIVE, TEMPLATE_PROMPT, WORKFLOWS

API_DIR = os.path.join(ROOT, "example_workflows", "api")
OWN_TESTS = ("wan22_tiny_demo", "wan22_t2v_a14b_lightx2v_4steps", "wan22_t2v_a14b_lightx2v_3stage",
             "wan22_t2v_a14b_template_cachedit_model", "wan22_t2v_a14b_parallel")
NATIVE_TEXT = [name for name in WORKFLOWS if name not in OWN_TESTS]


def api_workflow(name):
    with open(os.path.join(API_DIR, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def report_in_history(entry):
    """The run report a text output of the prompt shows (the one that is JSON), read from its /history entry."""
    return json.loads(next(v for v in entry["outputs"].values() if "text" in v and v["text"][0].startswith("{"))
                      ["text"][0])


def test_the_demo_api_workflow_succeeds_and_reports_the_split_and_the_cache(standin_server):
    entry = run_prompt(standin_server, api_workflow("wan22_tiny_demo"))
    assert entry["status"]["status_str"] == "success"
    report = json.loads(entry["outputs"]["14"]["text"][0])
    assert report["split"] == {"high": 14, "low": 6} and report["cache"]["low"]["cached_steps"]


def with_tiny_size(prompt, steps=8):
    """The same workflow with the video made tiny and, unless given, 8 steps; its positive prompt is the
    template's, so that every run here shares the server's cached umt5 encodings (each costs tens of
    seconds here)."""
    prompt = copy.deepcopy(prompt)
    for node in prompt.values():
        if node["class_type"] in ("EmptyHunyuanLatentVideo", "WanImageToVideo", "WanVaceToVideo",
                                  "Wan22ImageToVideoLatent"):
            node["inputs"].update(width=64, height=64, length=min(node["inputs"]["length"], 5))
        if node["class_type"] == "Wan22Schedule" and steps is not None:
            node["inputs"]["steps"] = steps
        if node["class_type"] == "CLIPTextEncode" and node["inputs"]["text"] != NEGATIVE:
            node["inputs"]["text"] = TEMPLATE_PROMPT
    return prompt


@pytest.mark.parametrize("name", NATIVE_TEXT)
def test_every_native_text_workflow_runs_end_to_end(native_text_server, name):
    """Every node of the workflow as shipped, the native umt5 text encoder included (full-size stand-in),
    at a tiny video size: a 832x480x81 run takes about half an hour on two cores even with tiny experts."""
    prompt = with_tiny_size(api_workflow(name))
    assert {v["class_type"] for v in prompt.values()} == {v["class_type"] for v in api_workflow(name).values()}
    entry = run_prompt(native_text_server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_in_history(entry)
    assert report["steps"] == 8 and sum(report["split"].values()) == 8


def test_a_workflow_as_0_7_0_shipped_it_still_runs_with_its_threshold(native_text_server):
    """The text-to-video API workflow as 0.7.0 shipped it (its Cache-DiT node at the threshold criterion, 0.24,
    warm-ups 4 and 2; the shipped one now carries the node's defaults), at a tiny size: it runs with its values."""
    with open(os.path.join(os.path.dirname(__file__), "saved", "wan22_t2v_a14b_cachedit_0.7.0_api.json"),
              encoding="utf-8") as f:
        saved = json.load(f)
    cache = next(v for v in saved.values() if v["class_type"] == "Wan22CacheDiT")["inputs"]
    assert (cache["criterion"], cache["residual_diff_threshold"]) == ("threshold", 0.24)
    entry = run_prompt(native_text_server, with_tiny_size(saved))
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_in_history(entry)
    for role in ("high", "low"):
        assert report["cache"][role]["criterion"] == "threshold" and report["cache"][role]["threshold"] == 0.24
    assert report["cache"]["plan"].startswith("high DBCache_F1B0_W4I1M0MC3_R0.24")


def test_the_lightx2v_template_set_up_splits_two_and_two_with_its_loras_on_the_template_files(native_text_server):
    """ComfyUI's own Wan2.2 14B T2V template, 4-step LightX2V LoRAs: its own loader and LoRA nodes feed our
    bridge, and the switch comes from the boundary (0.875 -> 2 / 2), on stand-ins named as its files."""
    api = api_workflow("wan22_t2v_a14b_lightx2v_4steps")
    loras = sorted(v["inputs"]["lora_name"] for v in api.values() if v["class_type"] == "LoraLoaderModelOnly")
    assert loras == ["wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
                     "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"]
    sched = next(v for v in api.values() if v["class_type"] == "Wan22Schedule")["inputs"]
    sampler = next(v for v in api.values() if v["class_type"] == "Wan22TwoStageSampler")["inputs"]
    assert (sched["sampler"], sched["scheduler"], sched["steps"], sched["flow_shift"], sched["boundary"]) == (
        "euler", "simple", 4, 5.0, "auto")
    assert (sampler["cfg_high"], sampler["cfg_low"]) == (1.0, 1.0)
    prompt = with_tiny_size(api, steps=4)
    assert {v["class_type"] for v in prompt.values()} == {v["class_type"] for v in api.values()}
    entry = run_prompt(native_text_server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_in_history(entry)
    assert report["split"] == {"high": 2, "low": 2} and report["boundary_ratio"] == 0.875
    assert report["sigmas"] == [1.0, 0.9375, 0.833333, 0.625, 0.0]
    assert report["transformer_calls"] == {"high": 2, "low": 2}


def test_the_three_stage_lightx2v_workflow_runs_its_three_stages_split_from_the_sigmas(native_text_server):
    """Shift 5, 8 LightX2V steps, a lead of 24 steps handing over at step 1: 3 lead (CFG 3.5, without the LoRAs)
    / 3 high / 4 low, the hand-off exact (step 3 of 24 is step 1 of 8)."""
    api = api_workflow("wan22_t2v_a14b_lightx2v_3stage")
    lead = next(v for v in api.values() if v["class_type"] == "Wan22LeadStage")["inputs"]
    assert (lead["lead_steps"], lead["start_step"], lead["cfg"]) == (24, 1, 3.5)
    entry = run_prompt(native_text_server, with_tiny_size(api, steps=None))
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_in_history(entry)
    assert report["split"] == {"lead": 3, "high": 3, "low": 4} and report["lead"]["hand_off_exact"] is True
    assert report["cfg"] == {"high": 1.0, "low": 1.0, "lead": 3.5}
    assert report["experts"]["lead"] == "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"
    assert [u["file"] for u in report["loras"]["high"]] == []  # the LoRAs are the template's own nodes


def test_the_template_with_the_cache_dit_model_node_runs_on_its_two_ksampleradvanced(native_text_server):
    """The official template's graph as it ships (20 steps, switch at 10) with a Cache-DiT MODEL node on each
    expert: it runs, and each node reports its plan."""
    api = api_workflow("wan22_t2v_a14b_template_cachedit_model")
    kinds = sorted(v["class_type"] for v in api.values())
    assert kinds.count("Wan22CacheDiTModel") == 2 and kinds.count("KSamplerAdvanced") == 2
    assert not any(kind.startswith("Wan22") and kind != "Wan22CacheDiTModel" for kind in kinds)
    entry = run_prompt(native_text_server, with_tiny_size(api))
    assert entry["status"]["status_str"] == "success", entry["status"]
    cache_nodes = [k for k, v in api.items() if v["class_type"] == "Wan22CacheDiTModel"]
    assert all("a context of its own for each sample call" in entry["outputs"][k]["text"][0] for k in cache_nodes)


def test_the_parallel_workflow_runs_on_two_workers_over_http(native_text_server):
    """The text-to-video workflow with the parallel plan, posted to a real server: two CPU workers (devices
    'auto' on a machine without a GPU) run it, on the two-head stand-ins (the template's one-head stand-ins
    cannot be split), and the report names them."""
    pytest.importorskip("ray", reason="the parallel plan needs Ray (requirements-dev.txt)")
    from devtools.standins import TWO_HEAD_FILES

    api = api_workflow("wan22_t2v_a14b_parallel")
    plan = next(v for v in api.values() if v["class_type"] == "Wan22ParallelPlan")["inputs"]
    assert (plan["workers"], plan["devices"], plan["ulysses_degree"]) == (2, "auto", 2)
    prompt = with_tiny_size(api)
    loader = next(v for v in prompt.values() if v["class_type"] == "Wan22ExpertLoader")["inputs"]
    loader.update(high_noise_model=TWO_HEAD_FILES["high"], low_noise_model=TWO_HEAD_FILES["low"])
    entry = run_prompt(native_text_server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_in_history(entry)
    assert report["parallel"]["workers"] == 2 and report["parallel"]["devices"] == ["cpu", "cpu"]
    assert report["parallel"]["ranks_agree"] and report["steps"] == 8


AS_SHIPPED = {"wan22_low_noise_t2i": {"high": 0, "low": 30},
              "wan22_t2v_a14b_lightx2v_3stage": {"lead": 3, "high": 3, "low": 4}}
# Runs as shipped in the as-shipped run of the workflow it names (below), which holds every node it has.
COVERED_AS_SHIPPED = {"wan22_t2v_a14b_lightx2v_4steps": "wan22_t2v_a14b_lightx2v_3stage"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(AS_SHIPPED))
def test_the_workflows_cheap_enough_here_finish_as_shipped(native_text_server, name):
    """Unchanged API files: the three-stage LightX2V video (640x640, 81 frames) and the one-frame low-noise
    image. The two 40-step 832x480x81 videos take about half an hour each on two cores, so they run above at a
    tiny size; the 4-step LightX2V video is the three-stage one's graph without its lead (see the next test)."""
    entry = run_prompt(native_text_server, api_workflow(name))
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert report_in_history(entry)["split"] == AS_SHIPPED[name]


def fixed_inputs(api: dict) -> dict:
    """Each node type's values (links and the file name prefix aside), as a set per type."""
    found = {}
    for entry in api.values():
        values = {k: v for k, v in entry["inputs"].items() if not isinstance(v, list) and k != "filename_prefix"}
        found.setdefault(entry["class_type"], set()).add(json.dumps(values, sort_keys=True))
    return found


@pytest.mark.parametrize("name, run_by", list(COVERED_AS_SHIPPED.items()))
def test_a_workflow_not_run_as_shipped_has_its_every_node_and_value_in_one_that_is(name, run_by):
    """The as-shipped run of `run_by` covers `name` at its full size: every node type of `name`, with the same
    values (files, LoRAs, size and frames, sampler and CFG; the step count aside), is in `run_by`, which runs
    as shipped in make test-slow; `name` itself runs above at a tiny size."""
    assert run_by in AS_SHIPPED
    ours, theirs = fixed_inputs(api_workflow(name)), fixed_inputs(api_workflow(run_by))
    for class_type, values in ours.items():
        assert class_type in theirs, class_type
        if class_type == "Wan22Schedule":  # the lead stage's workflow runs 8 main steps where this one runs 4
            values = {json.dumps({**json.loads(v), "steps": 0}) for v in values}
            theirs[class_type] = {json.dumps({**json.loads(v), "steps": 0}) for v in theirs[class_type]}
        assert values <= theirs[class_type], (class_type, values - theirs[class_type])


def readme_snippet() -> str:
    """The Python block of "Queueing through the API" in docs/workflows.md (the README links it)."""
    with open(os.path.join(ROOT, "docs", "workflows.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Queueing through the API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_api_snippet_works_on_a_repeated_prompt(standin_server, monkeypatch, capsys):
    """The documented snippet (docs/workflows.md, linked from the README), on the demo workflow, queued twice:
    the second time ComfyUI serves the whole prompt from its cache, and the snippet still reads the report."""
    snippet = readme_snippet()
    assert "wan22_t2v_a14b_cachedit.json" in snippet and "http://127.0.0.1:8188" in snippet
    snippet = snippet.replace("wan22_t2v_a14b_cachedit.json", "wan22_tiny_demo.json").replace(
        "http://127.0.0.1:8188", standin_server.url)
    monkeypatch.chdir(ROOT)
    for _ in range(2):
        exec(compile(snippet, "docs/workflows.md", "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        assert printed[0] == "success", printed
        assert printed[1].startswith("{'high': 14, 'low': 6} ["), printed
        assert ".webp" in printed[2], printed
