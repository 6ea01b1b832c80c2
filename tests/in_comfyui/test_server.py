"""A real ComfyUI server on 127.0.0.1: the pack's nodes over HTTP, as API clients and the frontend see them."""

import pytest

from .prompts import loader, schedule_prompt


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_models):
    import os

    from devtools.comfy_server import ComfyServer

    base = tmp_path_factory.mktemp("server_base")
    os.symlink(tiny_models["dir"], base / "models")
    with ComfyServer(str(base)) as running:
        yield running


def test_object_info_lists_the_nodes_with_the_designed_inputs_and_outputs(server):
    info = server.get("/object_info")
    loader_info = info["Wan22ExpertLoader"]
    assert list(loader_info["input"]["required"]) == ["high_noise_model", "low_noise_model", "weight_dtype"]
    assert loader_info["output"] == ["WAN22_EXPERTS"] and loader_info["display_name"] == "Load Wan2.2 Experts"
    assert "none" in loader_info["input"]["required"]["high_noise_model"][1]["options"]
    assert list(info["Wan22DiffusersExpertLoader"]["input"]["required"]) == ["model_folder", "experts", "weight_dtype"]
    sched = info["Wan22Schedule"]
    assert list(sched["input"]["required"]) == ["experts", "sampler", "steps", "flow_shift", "boundary",
                                                "boundary_ratio"]
    assert sched["output"] == ["WAN22_SCHEDULE", "INT", "INT"]
    assert sched["output_name"] == ["schedule", "high_steps", "low_steps"]


def test_a_queued_prompt_runs_and_its_history_carries_the_split(server, tiny_models):
    names = tiny_models["names"]
    status, body = server.queue(schedule_prompt(loader(names[("t2v", "high", "fp16")],
                                                       names[("t2v", "low", "fp16")]), flow_shift=5.0))
    assert status == 200, body
    entry = server.wait(body["prompt_id"], timeout=120)
    assert entry["status"]["status_str"] == "success"
    assert entry["outputs"]["2"]["split"][0]["high"] == 17 and entry["outputs"]["2"]["split"][0]["low"] == 23
    assert entry["outputs"]["3"]["text"] == ["17"]


def test_an_invalid_prompt_is_refused_at_queue_time_with_the_input_named(server, tiny_models):
    status, body = server.queue(schedule_prompt(loader(low=tiny_models["broken"]["truncated"])))
    assert status == 400
    errors = body["node_errors"]["1"]["errors"]
    assert any("low_noise_model:" in e["details"] and "truncated" in e["details"] for e in errors)
    status, body = server.queue(schedule_prompt(loader()))
    assert status == 400 and "load at least one expert" in body["node_errors"]["1"]["errors"][0]["details"]
