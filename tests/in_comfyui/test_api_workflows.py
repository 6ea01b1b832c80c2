"""The shipped API-format workflows, posted to a real server's /prompt with tiny stand-in files."""

import copy
import json
import os

import pytest

from devtools.paths import ROOT
from devtools.standins import TEXT_FOLDER, UMT5
from devtools.workflow_specs import WORKFLOWS

API_DIR = os.path.join(ROOT, "example_workflows", "api")
NATIVE_TEXT = [name for name in WORKFLOWS if name != "wan22_tiny_demo"]


def api_workflow(name):
    with open(os.path.join(API_DIR, f"{name}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def server(standin_server):
    return standin_server


def run(server, prompt):
    status, body = server.queue(prompt)
    assert status == 200 and body["node_errors"] == {}, body
    return server.wait(body["prompt_id"], timeout=600)


def test_the_demo_api_workflow_succeeds_and_reports_the_split_and_the_cache(server):
    entry = run(server, api_workflow("wan22_tiny_demo"))
    assert entry["status"]["status_str"] == "success"
    report = json.loads(entry["outputs"]["14"]["text"][0])
    assert report["split"] == {"high": 13, "low": 7} and report["cache"]["low"]["cached_steps"]


@pytest.mark.parametrize("name", NATIVE_TEXT)
def test_a_native_text_encoder_workflow_validates_and_stops_only_at_the_umt5_stand_in(server, name):
    """ComfyUI builds umt5-xxl from a fixed 5.7B-parameter config, so its stand-in cannot be a tiny working
    file: the run is accepted, and fails at the native CLIP Loader and nowhere else."""
    entry = run(server, api_workflow(name))
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert entry["status"]["status_str"] == "error" and len(errors) == 1
    assert errors[0]["node_type"] == "CLIPLoader"


def with_tiny_text_and_size(prompt, steps=8):
    """The same workflow with the two native text nodes replaced by the diffusers-folder text encoder,
    and the video made tiny (a 832x480x81 run of even tiny experts takes half an hour on two cores)."""
    prompt = copy.deepcopy(prompt)
    loader_id, (pos_id, neg_id) = next(k for k, v in prompt.items() if v["class_type"] == "CLIPLoader"), [
        k for k, v in prompt.items() if v["class_type"] == "CLIPTextEncode"]
    prompt[loader_id] = {"class_type": "Wan22TextEncode",
                         "inputs": {"model_folder": TEXT_FOLDER, "prompt": prompt[pos_id]["inputs"]["text"],
                                    "negative_prompt": prompt[neg_id]["inputs"]["text"]}}
    del prompt[pos_id], prompt[neg_id]
    for node in prompt.values():
        for key, value in node["inputs"].items():
            if value == [pos_id, 0]:
                node["inputs"][key] = [loader_id, 0]
            elif value == [neg_id, 0]:
                node["inputs"][key] = [loader_id, 1]
        if node["class_type"] in ("EmptyHunyuanLatentVideo", "WanImageToVideo"):
            node["inputs"].update(width=64, height=64, length=min(node["inputs"]["length"], 5))
        if node["class_type"] == "Wan22Schedule":
            node["inputs"]["steps"] = steps
    return prompt


@pytest.mark.parametrize("name", NATIVE_TEXT)
def test_every_other_node_of_a_native_text_workflow_runs_to_success(server, name):
    prompt = with_tiny_text_and_size(api_workflow(name))
    assert UMT5 not in json.dumps(prompt)
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = json.loads(next(v for v in entry["outputs"].values() if "text" in v and v["text"][0].startswith("{"))
                        ["text"][0])
    assert report["steps"] == 8 and sum(report["split"].values()) == 8


def test_the_lightx2v_template_set_up_splits_two_and_two_with_its_loras_on_the_template_files(server):
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
    entry = run(server, with_tiny_text_and_size(api, steps=4))
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = json.loads(next(v for v in entry["outputs"].values() if "text" in v and v["text"][0].startswith("{"))
                        ["text"][0])
    assert report["split"] == {"high": 2, "low": 2} and report["boundary_ratio"] == 0.875
    assert report["forward_passes"] == {"high": 2, "low": 2}
    assert [u["file"] for u in report["loras"]["high"]] == [lora["high_noise_lora"]]
    assert [u["file"] for u in report["loras"]["low"]] == [lora["low_noise_lora"]]
