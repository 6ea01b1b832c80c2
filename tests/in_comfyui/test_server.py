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
    assert list(sched["input"]["optional"]) == ["scheduler"]  # added after the existing inputs
    assert sched["output"] == ["WAN22_SCHEDULE", "INT", "INT", "SIGMAS", "SIGMAS"]
    assert sched["output_name"] == ["schedule", "high_steps", "low_steps", "sigmas_high", "sigmas_low"]
    weight_dtypes = loader_info["input"]["required"]["weight_dtype"][1]["options"]
    assert weight_dtypes == ["default", "fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]
    bridge = info["Wan22ExpertsFromModel"]
    assert {name: spec[0] for name, spec in bridge["input"]["optional"].items()} == {"high_noise_model": "MODEL",
                                                                                      "low_noise_model": "MODEL"}
    assert bridge["output"] == ["WAN22_EXPERTS"]
    cache = info["Wan22CacheDiT"]["input"]
    assert list(cache["optional"]) == ["calibrator"] and cache["optional"]["calibrator"][1]["options"] == ["none",
                                                                                                       "taylorseer"]


def test_a_queued_prompt_runs_and_its_history_carries_the_split(server, tiny_models):
    names = tiny_models["names"]
    status, body = server.queue(schedule_prompt(loader(names[("t2v", "high", "fp16")],
                                                       names[("t2v", "low", "fp16")]), sampler="euler",
                                                flow_shift=5.0))
    assert status == 200, body
    entry = server.wait(body["prompt_id"], timeout=1200)
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


def split_request(server, loader_type, values, **schedule):
    loader = {"type": loader_type, "models" if loader_type == "Wan22ExpertsFromModel" else "values": values}
    body = {"loader": loader, "sampler": "euler", "scheduler": "simple", "steps": 40, "flow_shift": 12.0,
            "boundary": "auto", "boundary_ratio": 0.875, **schedule}
    return server.post("/wan22/split", body)


def test_the_live_split_route_answers_with_the_nodes_own_split(server, tiny_models):
    names = tiny_models["names"]
    both = {"high_noise_model": names[("t2v", "high", "fp16")], "low_noise_model": names[("t2v", "low", "fp16")]}
    assert split_request(server, "Wan22ExpertLoader", both, flow_shift=5.0)[1]["high"] == 17
    status, answer = split_request(server, "Wan22ExpertLoader", both, flow_shift=12.0)
    assert status == 200 and (answer["high"], answer["low"]) == (26, 14)
    assert answer["summary"] == "euler/simple, 40 steps, shift 12, boundary 0.875 (model_default): 26 high / 14 low"
    status, answer = split_request(server, "Wan22ExpertLoader", both, sampler="unipc", flow_shift=5.0)
    assert answer["summary"].startswith("uni_pc/simple") and answer["high"] == 18  # an old name, as the node runs it
    i2v = {"high_noise_model": names[("i2v", "high", "fp8_scaled")], "low_noise_model": names[("i2v", "low", "fp16")]}
    assert split_request(server, "Wan22ExpertLoader", i2v, flow_shift=5.0)[1]["boundary_ratio"] == 0.9
    # The MODEL bridge: which inputs are connected, and the file behind them when the canvas finds one.
    bridged = {"high": {"unet_name": names[("i2v", "high", "fp16")]}, "low": {}}
    status, answer = split_request(server, "Wan22ExpertsFromModel", bridged, flow_shift=5.0)
    assert (status, answer["boundary_ratio"], answer["boundary_known"]) == (200, 0.9, True)
    status, answer = split_request(server, "Wan22ExpertsFromModel", {"high": {}, "low": {}}, flow_shift=12.0)
    assert (answer["high"], answer["boundary_ratio"], answer["boundary_known"]) == (26, 0.875, False)
    status, answer = split_request(server, "Wan22ExpertsFromModel", {"high": None, "low": {}})
    assert (answer["high"], answer["low"], answer["boundary_source"]) == (0, 40, "low_noise_only")
    low_only = {"high_noise_model": "none", "low_noise_model": names[("t2v", "low", "fp16")]}
    status, answer = split_request(server, "Wan22ExpertLoader", low_only, sampler="euler")
    assert (answer["high"], answer["low"], answer["boundary_source"]) == (0, 40, "low_noise_only")
    folder = {"model_folder": names[("i2v", "diffusers")], "experts": "both"}
    status, answer = split_request(server, "Wan22DiffusersExpertLoader", folder, boundary="custom", boundary_ratio=0.8)
    assert answer["boundary_source"] == "custom" and answer["boundary_ratio"] == 0.8


def test_the_live_split_route_explains_what_is_wrong(server, tiny_models):
    status, answer = split_request(server, "Wan22ExpertLoader", {"high_noise_model": "none", "low_noise_model": "none"})
    assert status == 400 and "load at least one expert" in answer["error"]
    low = {"high_noise_model": "none", "low_noise_model": tiny_models["names"][("t2v", "low", "fp16")]}
    status, answer = split_request(server, "Wan22ExpertLoader", low, flow_shift=-1.0)
    assert status == 400 and answer["error"].startswith("flow_shift:")
    status, answer = split_request(server, "KSampler", {})
    assert status == 400 and "connect the experts input to a Wan2.2 expert loader" in answer["error"]
    status, answer = split_request(server, "Wan22ExpertsFromModel", {"high": None, "low": None})
    assert status == 400 and "connect the MODEL of at least one expert" in answer["error"]
    status, answer = split_request(server, "Wan22ExpertLoader", low, scheduler="cosine")
    assert status == 400 and answer["error"].startswith("scheduler: unknown scheduler 'cosine'")
