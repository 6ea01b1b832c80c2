"""The shipped API-format workflows, posted to a real server's /prompt with tiny stand-in files."""

import copy
import json
import os

import pytest

from devtools.paths import ROOT
from devtools.standins import UMT5
from devtools.workflow_specs import WORKFLOWS

API_DIR = os.path.join(ROOT, "example_workflows", "api")
NATIVE_TEXT = [name for name in WORKFLOWS if name != "wan22_tiny_demo"]


def api_workflow(name):
    with open(os.path.join(API_DIR, f"{name}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def server(standin_server):
    return standin_server


@pytest.fixture(scope="module")
def native_server(tmp_path_factory):
    """A server whose umt5 stand-in really runs: full size (6.7 GB, deleted afterwards; see
    devtools/umt5_standin.py), so every native node of the shipped workflows runs."""
    from devtools.comfy_server import ComfyServer
    from devtools.standins import write_standins

    base = tmp_path_factory.mktemp("native_text_base")
    write_standins(str(base / "models"), str(base / "input"), working_umt5=True)
    try:
        with ComfyServer(str(base)) as running:
            yield running
    finally:
        os.remove(base / "models" / "text_encoders" / UMT5)


def report_of(entry):
    return json.loads(next(v for v in entry["outputs"].values() if "text" in v and v["text"][0].startswith("{"))
                      ["text"][0])


def run(server, prompt):
    status, body = server.queue(prompt)
    assert status == 200 and body["node_errors"] == {}, body
    return server.wait(body["prompt_id"], timeout=600)


def test_the_demo_api_workflow_succeeds_and_reports_the_split_and_the_cache(server):
    entry = run(server, api_workflow("wan22_tiny_demo"))
    assert entry["status"]["status_str"] == "success"
    report = json.loads(entry["outputs"]["14"]["text"][0])
    assert report["split"] == {"high": 13, "low": 7} and report["cache"]["low"]["cached_steps"]


def with_tiny_size(prompt, steps=8):
    """The same workflow with the video made tiny and, unless given, 8 steps."""
    prompt = copy.deepcopy(prompt)
    for node in prompt.values():
        if node["class_type"] in ("EmptyHunyuanLatentVideo", "WanImageToVideo"):
            node["inputs"].update(width=64, height=64, length=min(node["inputs"]["length"], 5))
        if node["class_type"] == "Wan22Schedule":
            node["inputs"]["steps"] = steps
    return prompt


@pytest.mark.parametrize("name", NATIVE_TEXT)
def test_every_native_text_workflow_runs_end_to_end(native_server, name):
    """Every node of the workflow as shipped, the native umt5 text encoder included (full-size stand-in),
    at a tiny video size: a 832x480x81 run takes about half an hour on two cores even with tiny experts."""
    prompt = with_tiny_size(api_workflow(name))
    assert {v["class_type"] for v in prompt.values()} == {v["class_type"] for v in api_workflow(name).values()}
    entry = run(native_server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_of(entry)
    assert report["steps"] == 8 and sum(report["split"].values()) == 8


def test_the_lightx2v_template_set_up_splits_two_and_two_with_its_loras_on_the_template_files(native_server):
    """ComfyUI's own Wan2.2 14B T2V template, 4-step LightX2V LoRAs: through our nodes the switch comes from
    the boundary (0.875 -> 2 / 2), on stand-ins named as the template's files."""
    api = api_workflow("wan22_t2v_a14b_lightx2v_4steps")
    lora = next(v for v in api.values() if v["class_type"] == "Wan22LoraLoader")["inputs"]
    assert (lora["high_noise_lora"], lora["low_noise_lora"]) == (
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors")
    sched = next(v for v in api.values() if v["class_type"] == "Wan22Schedule")["inputs"]
    sampler = next(v for v in api.values() if v["class_type"] == "Wan22TwoStageSampler")["inputs"]
    assert (sched["sampler"], sched["steps"], sched["flow_shift"], sched["boundary"]) == ("euler", 4, 5.0, "auto")
    assert (sampler["cfg_high"], sampler["cfg_low"]) == (1.0, 1.0)
    entry = run(native_server, with_tiny_size(api, steps=4))
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = report_of(entry)
    assert report["split"] == {"high": 2, "low": 2} and report["boundary_ratio"] == 0.875
    assert report["forward_passes"] == {"high": 2, "low": 2}
    assert [u["file"] for u in report["loras"]["high"]] == [lora["high_noise_lora"]]
    assert [u["file"] for u in report["loras"]["low"]] == [lora["low_noise_lora"]]


AS_SHIPPED = {"wan22_t2v_a14b_lightx2v_4steps": {"high": 2, "low": 2}, "wan22_low_noise_t2i": {"high": 0, "low": 30}}


@pytest.mark.parametrize("name", list(AS_SHIPPED))
def test_the_workflows_cheap_enough_here_finish_as_shipped(native_server, name):
    """Unchanged API files: the 4-step LightX2V video (640x640, 81 frames) and the one-frame low-noise
    image. The two 40-step 832x480x81 videos take about half an hour each on two cores, so they run
    above at a tiny size."""
    entry = run(native_server, api_workflow(name))
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert report_of(entry)["split"] == AS_SHIPPED[name]
