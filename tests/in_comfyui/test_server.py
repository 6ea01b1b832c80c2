"""A real ComfyUI server on 127.0.0.1: the pack's nodes over HTTP, as API clients and the frontend see them."""

import pytest

from .prompts import (bridged, cache_node, diffusers_loader, expert_files, loader, lora_node, schedule, schedule_prompt,
                      unet)


def test_object_info_lists_the_nodes_with_the_designed_inputs_and_outputs(tiny_models_server):
    info = tiny_models_server.get("/object_info")
    loader_info = info["Wan22ExpertLoader"]
    assert list(loader_info["input"]["required"]) == ["high_noise_model", "low_noise_model", "weight_dtype"]
    assert loader_info["output"] == ["WAN22_EXPERTS"] and loader_info["display_name"] == "Load Wan2.2 Experts"
    assert "none" in loader_info["input"]["required"]["high_noise_model"][1]["options"]
    assert list(info["Wan22DiffusersExpertLoader"]["input"]["required"]) == ["model_folder", "experts", "weight_dtype"]
    sched = info["Wan22Schedule"]
    assert list(sched["input"]["required"]) == ["experts", "sampler", "steps", "flow_shift", "boundary"]
    boundary = sched["input"]["required"]["boundary"]
    assert boundary[0] == "COMFY_DYNAMICCOMBO_V3" and [o["key"] for o in boundary[1]["options"]] == ["auto", "custom"]
    (ratio,) = boundary[1]["options"][1]["inputs"]["optional"].items()
    assert ratio[0] == "boundary_ratio" and (ratio[1][1]["min"], ratio[1][1]["max"]) == (0.0, 1.0)
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
    assert list(cache["optional"]) == ["calibrator", "criterion", "error_target"]  # added after the existing inputs
    assert cache["optional"]["calibrator"][1]["options"] == ["none", "taylorseer", "dmd", "foca"]  # new ones after
    assert cache["optional"]["criterion"][1]["options"] == ["error", "threshold"]
    assert cache["optional"]["criterion"][1]["default"] == "error"


def test_a_queued_prompt_runs_and_its_history_carries_the_split(tiny_models_server, tiny_models):
    names = tiny_models["names"]
    experts = loader(names[("t2v", "high", "fp16")], names[("t2v", "low", "fp16")])
    status, body = tiny_models_server.queue(schedule_prompt(experts, sampler="euler", flow_shift=5.0))
    assert status == 200, body
    entry = tiny_models_server.wait(body["prompt_id"], timeout=1200)
    assert entry["status"]["status_str"] == "success"
    assert entry["outputs"]["2"]["split"][0]["high"] == 17 and entry["outputs"]["2"]["split"][0]["low"] == 23
    assert entry["outputs"]["3"]["text"] == ["17"]


def test_an_invalid_prompt_is_refused_at_queue_time_with_the_input_named(tiny_models_server, tiny_models):
    status, body = tiny_models_server.queue(schedule_prompt(loader(low=tiny_models["broken"]["truncated"])))
    assert status == 400
    errors = body["node_errors"]["1"]["errors"]
    assert any("low_noise_model:" in e["details"] and "truncated" in e["details"] for e in errors)
    status, body = tiny_models_server.queue(schedule_prompt(loader()))
    assert status == 400 and "load at least one expert" in body["node_errors"]["1"]["errors"][0]["details"]


def split_request(server, experts, **schedule_inputs):
    """The canvas's question for one schedule node ("2") fed by `experts` (the node(s) giving "1"): the API
    prompt the frontend makes of the graph, and the ids of the schedule nodes to answer for."""
    nodes = experts if "1" in experts else {"1": experts}
    prompt = {**nodes, "2": schedule("1", **{"sampler": "euler", "flow_shift": 12.0, **schedule_inputs})}
    status, body = server.post("/wan22/split", {"prompt": prompt, "nodes": ["2"]})
    answer = body["splits"]["2"]
    # 200 only with the split; a refusal is a 400 naming the input, first in its text.
    assert status == (400 if "error" in answer else 200), body
    assert "error" not in answer or (body["error"] == answer["error"] and answer["error"].startswith(answer["input"]))
    return answer


def test_the_live_split_route_answers_with_the_nodes_own_split(tiny_models_server, tiny_models):
    names = tiny_models["names"]
    high, low = expert_files(tiny_models)
    assert split_request(tiny_models_server, loader(high, low), flow_shift=5.0)["high"] == 17
    answer = split_request(tiny_models_server, loader(high, low), flow_shift=12.0)
    assert (answer["high"], answer["low"]) == (26, 14)
    assert answer["summary"] == "euler/simple, 40 steps, shift 12, boundary 0.875 (model_default): 26 high / 14 low"
    answer = split_request(tiny_models_server, loader(high, low), sampler="unipc", flow_shift=5.0)
    assert answer["summary"].startswith("uni_pc/simple") and answer["high"] == 18  # an old name, as the node runs it
    i2v = loader(names[("i2v", "high", "fp8_scaled")], names[("i2v", "low", "fp16")])
    assert split_request(tiny_models_server, i2v, flow_shift=5.0)["boundary_ratio"] == 0.9
    low_only = split_request(tiny_models_server, loader(low=low))
    assert (low_only["high"], low_only["low"], low_only["boundary_source"]) == (0, 40, "low_noise_only")
    folder = diffusers_loader(names[("i2v", "diffusers")])
    answer = split_request(tiny_models_server, folder, boundary="custom", boundary_ratio=0.8)
    assert answer["boundary_source"] == "custom" and answer["boundary_ratio"] == 0.8
    five_b = tiny_models["broken"]["wan_5b"]  # TI2V-5B, one transformer: one stage of every step, in either input
    for experts, split in ((loader(high=five_b), (40, 0)), (loader(low=five_b), (0, 40))):
        answer = split_request(tiny_models_server, experts)
        assert (answer["high"], answer["low"]) == split, answer  # as the sampler runs it (test_variants.py)


def test_the_live_split_route_reads_the_bridges_files_and_passes_through_the_packs_nodes(tiny_models_server,
                                                                                         tiny_models):
    names = tiny_models["names"]
    i2v_high = names[("i2v", "high", "fp16")]
    lora = {"high": (tiny_models["loras"]["high"], 1.0)}
    # The bridge: which MODEL inputs are connected, and the file behind them through a native LoRA loader.
    answer = split_request(tiny_models_server, bridged(high=i2v_high, loras=lora), flow_shift=5.0)
    assert (answer["high"], answer["low"], answer["boundary_ratio"], answer["boundary_known"]) == (40, 0, None, True)
    experts = bridged(high=i2v_high, low=names[("i2v", "low", "fp16")], loras=lora)
    answer = split_request(tiny_models_server, experts, flow_shift=5.0)
    assert (answer["boundary_ratio"], answer["boundary_known"]) == (0.9, True)
    # A MODEL whose file the prompt does not show: the text-to-video boundary, said to be assumed.
    merged = {"class_type": "ModelMergeSimple", "inputs": {"model1": ["10", 0], "model2": ["11", 0], "ratio": 0.5}}
    unknown = {"10": unet(i2v_high), "11": unet(names[("i2v", "low", "fp16")]), "20": merged,
               "1": {"class_type": "Wan22ExpertsFromModel",
                     "inputs": {"high_noise_model": ["20", 0], "low_noise_model": ["20", 0]}}}
    answer = split_request(tiny_models_server, unknown)
    assert (answer["high"], answer["boundary_ratio"], answer["boundary_known"]) == (26, 0.875, False)
    # Cache-DiT and LoRA nodes between the loader and the schedule give the experts through.
    chain = {"10": loader(*expert_files(tiny_models)), "11": lora_node("10"), "1": cache_node("11")}
    assert split_request(tiny_models_server, chain)["high"] == 26


def test_the_live_split_route_explains_what_is_wrong(tiny_models_server, tiny_models):
    low = expert_files(tiny_models)[1]
    assert "load at least one expert" in split_request(tiny_models_server, loader())["error"]
    # ComfyUI's own validation, with the schedule node's ranges: what queueing the prompt would say.
    assert split_request(tiny_models_server, loader(low=low), flow_shift=-1.0)["error"] == (
        "flow_shift: Value -1.0 smaller than min of 0.01")
    ksampler = {"class_type": "KSampler", "inputs": {}}
    answer = split_request(tiny_models_server, ksampler)
    assert answer["error"].startswith("experts: Return type mismatch between linked nodes")
    bridge = {"class_type": "Wan22ExpertsFromModel", "inputs": {}}
    assert "connect the MODEL of at least one expert" in split_request(tiny_models_server, bridge)["error"]
    answer = split_request(tiny_models_server, loader(low=low), scheduler="cosine")
    assert answer["error"].startswith("scheduler: unknown scheduler 'cosine'") and answer["input"] == "scheduler"
    unconnected = schedule("1")
    del unconnected["inputs"]["experts"]
    status, body = tiny_models_server.post("/wan22/split", {"prompt": {"2": unconnected, "3": loader(low=low)},
                                                            "nodes": ["2", "3"]})
    assert status == 400 and body["splits"]["2"]["error"] == "experts: Required input is missing"
    assert body["error"] == body["splits"]["2"]["error"]
    assert "is not a Wan2.2 Boundary & Flow Shift or Lead Stage node" in body["splits"]["3"]["error"]
    primitive = {"class_type": "PrimitiveInt", "inputs": {"value": 9}}
    linked = split_request(tiny_models_server, {"1": loader(low=low), "7": primitive}, steps=["7", 0])
    assert linked["error"].startswith("steps: comes from another node")
    # A refusal on a node upstream names that node too.
    answer = split_request(tiny_models_server, loader(low="missing.safetensors"))
    assert answer["input"] == "low_noise_model" and answer["node"] == "1"
    assert answer["error"].endswith("[on node 1, Wan22ExpertLoader]")
    for body, name in (({"nodes": ["2"]}, "prompt"), ({"prompt": {}, "nodes": "2"}, "nodes"), ([1, 2], "body"),
                       ({"prompt": {}, "nodes": ["2"]}, "nodes")):
        status, answer = tiny_models_server.post("/wan22/split", body)
        assert status == 400 and answer["input"] == name and answer["error"].startswith(f"{name}: ")


def test_the_canvas_learns_the_old_sampler_names_from_the_server(tiny_models_server):
    from wan22_cachedit.nodes.core.cache import CachePlan

    TARGET = CachePlan().error_target  # noqa: N806 (the node's default: unused by the threshold they keep)
    assert tiny_models_server.get("/wan22/canvas") == {"old_samplers": {"unipc": "uni_pc", "dpmpp": "dpmpp_2m"},
                                                       "split_nodes": ["Wan22Schedule", "Wan22LeadStage"],
                                                       "server_note": None,  # no WAN22_SERVER_NOTE here
                                                       "added_inputs": {
        "Wan22ParallelPlan": {"saved_length": 4, "values": ["ulysses"]},
        # Saved before the calibrator, the criterion and the error target: the threshold criterion they ran with.
        "Wan22CacheDiT": {"saved_length": 9, "values": ["none", "threshold", TARGET]},
        "Wan22CacheDiTModel": {"saved_length": 7, "values": ["none", "threshold", TARGET]},
        # Saved before calibration_size (seed, its control, cfg_high, cfg_low, error_budget): calibrated at full
        # size with the plan's calibrator alone, as they were; saved before calibrators: that calibrator alone.
        "Wan22CacheBudget": {"saved_length": 5, "values": [1.0, "the plan's"]}}}


def hostile_bodies(tiny_models):
    """Bodies a hostile client sent: (body, the field its 400 must name)."""
    high, low = expert_files(tiny_models)
    bridge = {"10": unet(high), "1": {"class_type": "Wan22ExpertsFromModel", "inputs": {"high_noise_model": ["10", 0]}}}
    with_schedule = lambda experts: {**experts, "2": schedule("1", sampler="euler")}  # noqa: E731
    return [
        # A string where the bridge's MODEL link (an object of models) was expected, and a loader given as a list.
        ({"prompt": with_schedule({**bridge, "1": {"class_type": "Wan22ExpertsFromModel",
                                                   "inputs": {"high_noise_model": {"high": "x"}}}}), "nodes": ["2"]},
         "high_noise_model"),
        ({"prompt": with_schedule({"1": loader(high=[1, 2], low=low)}), "nodes": ["2"]},
         "prompt['1'].inputs.high_noise_model"),
        ({"prompt": with_schedule({"1": loader(high={"high": "x"}, low=low)}), "nodes": ["2"]}, "high_noise_model"),
        ({"prompt": with_schedule({"1": [1, 2]}), "nodes": ["2"]}, "prompt['1']"),
        ({"prompt": {**with_schedule({"1": loader(high, low)}), "2": {"class_type": "Wan22Schedule",
                                                                      "inputs": [1, 2]}}, "nodes": ["2"]},
         "prompt['2'].inputs"),
        ({"prompt": with_schedule({"1": loader(high, low)}), "nodes": ["2"], "models": {"high": "x"}, "loader": [1, 2]},
         None),
    ]


def test_the_bodies_a_hostile_client_sent_are_refused_naming_the_field(tiny_models_server, tiny_models):
    for body, name in hostile_bodies(tiny_models):
        status, answer = tiny_models_server.post("/wan22/split", body)
        if name is None:  # keys the route does not read change nothing
            assert status == 200 and answer["splits"]["2"]["high"] == 26, answer
            continue
        assert status == 400 and answer["input"] == name and answer["error"].startswith(f"{name}: "), (body, answer)


@pytest.mark.parametrize("name,value", [("flow_shift", 1e308), ("flow_shift", 0.0), ("steps", 10**9), ("steps", -5),
                                        ("boundary.boundary_ratio", 1.5)])
def test_the_route_refuses_a_value_out_of_range_as_the_prompt_queue_does(tiny_models_server, tiny_models, name, value):
    """The node schemas' ranges, read by ComfyUI's own validation: the route and POST /prompt say the same."""
    prompt = schedule_prompt(loader(*expert_files(tiny_models)), sampler="euler", boundary="custom")
    prompt["2"]["inputs"][name] = value
    status, queued = tiny_models_server.queue(prompt)
    assert status == 400, queued
    (error,) = queued["node_errors"]["2"]["errors"]
    status, answer = tiny_models_server.post("/wan22/split", {"prompt": prompt, "nodes": ["2"]})
    assert status == 400 and answer["input"] == error["extra_info"]["input_name"] == name
    assert answer["error"] == f"{name}: {error['message']}" and error["details"] == name
    if value == 1e308:
        assert answer["error"] == "flow_shift: Value 1e+308 bigger than max of 100.0"
