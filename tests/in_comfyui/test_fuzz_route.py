"""The live-split route (POST /wan22/split) fuzzed over HTTP on a real ComfyUI server: whatever the body holds,
the answer is a 200 with every asked node's split or a 400 whose message names the field first, and the server
answers the valid bodies exactly as before."""

import json
import math
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.fuzzing import HOSTILE_TEXTS, mutated

from .prompts import bridged, cache_node, diffusers_loader, expert_files, lead_node, loader, lora_node, schedule, unet

ROUTE = "/wan22/split"
TEXT_LIMIT = 1000  # nodes.core.errors: messages never carry more


def post_raw(server, data: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + ROUTE, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def valid_bodies(tiny_models):
    """Requests the route answers with splits: each experts source it reads, a lead stage, a chain of the
    pack's nodes, two schedule nodes at once."""
    names, loras = tiny_models["names"], tiny_models["loras"]
    high, low = expert_files(tiny_models)
    with_schedule = lambda experts, **inputs: {**experts, "2": schedule("1", **inputs)}  # noqa: E731
    return [
        {"prompt": with_schedule({"1": loader(high, low)}, sampler="euler"), "nodes": ["2"]},
        {"prompt": with_schedule(bridged(high=names[("i2v", "high", "fp16")], low=names[("i2v", "low", "fp16")],
                                         loras={"high": (loras["high"], 1.0)}), boundary="custom",
                                 boundary_ratio=0.8, scheduler="beta"), "nodes": ["2"]},
        {"prompt": with_schedule({"1": diffusers_loader(names[("i2v", "diffusers")])}, sampler="dpmpp_2m", steps=9),
         "nodes": ["2"]},
        {"prompt": {**with_schedule({"1": loader(high, low)}, sampler="euler", steps=8, flow_shift=5.0),
                    "41": lead_node(lead_steps=24, start_step=1)}, "nodes": ["41", "2"]},
        {"prompt": with_schedule({"10": loader(low=low), "11": lora_node("10", low=loras["low"]),
                                  "1": cache_node("11")}, steps=30), "nodes": ["2"]},
        {"prompt": with_schedule({"10": unet(high), "1": {"class_type": "Wan22ExpertsFromModel",
                                                          "inputs": {"high_noise_model": ["10", 0]}}}),
         "nodes": ["2"]},
    ]


def near_values(tiny_models):
    """Values close to valid ones: other files, choices, numbers at and past the inputs' ranges, links."""
    names = tiny_models["names"]
    return [*names.values(), *tiny_models["broken"].values(), *tiny_models["loras"].values(), "none", "both",
            "high_noise_only", "euler", "unipc", "heun", "karras", "beta", "auto", "custom", "fixed", 0, 1, 2, 3, 10000,
            10001, 0.0, 0.01, 0.009, 1.0, 1.01, 100.0, 100.5, 1e308, -1e308, "5", "5.0", "1e308", float("nan"),
            ["1", 0], ["2", 0], ["2", 1], ["2", 4], ["10", 0], ["11", 0], ["41", 0], ["1", 1], ["9", 0], ["1", -1],
            {"class_type": "Wan22Schedule", "inputs": {"experts": ["2", 0]}}, {"class_type": "KSampler", "inputs": {}},
            {"class_type": "PrimitiveInt", "inputs": {"value": 9}}, {"class_type": "Nope"}]


def answer_of(server, data: bytes) -> tuple[int, dict]:
    status, raw = post_raw(server, data)
    assert status in (200, 400), (status, raw[:2000], server.log_tail())
    return status, json.loads(raw)  # strict JSON: a NaN in an answer would fail here


def check_answer(status: int, answer: dict, body):
    """The route's contract for any body."""
    if status == 200:
        assert set(answer) == {"splits"} and set(answer["splits"]) == set(body["nodes"]), answer
        for split in answer["splits"].values():
            assert "error" not in split and split["high"] >= 0 and split["low"] >= 0, split
            assert type(split["high"]) is int and type(split["low"]) is int and split["summary"], split
        return
    name, error = answer["input"], answer["error"]
    assert isinstance(name, str) and name and isinstance(error, str) and error.startswith(f"{name}: "), answer
    assert len(error) <= TEXT_LIMIT, len(error)
    assert " raised " not in error, answer  # an error nothing foresaw (logged): a defect to fix, not an answer
    if "splits" in answer:  # a well-formed request: every asked node answered, the first refusal on top
        assert set(answer["splits"]) == set(body["nodes"])
        refusals = [split for split in answer["splits"].values() if "error" in split]
        assert refusals and refusals[0]["error"] == error and refusals[0]["input"] == name


def named_field(answer, change, prompt) -> bool:
    """Whether a refusal names the input of the one value changed (prompt[node].inputs[name]) in its field or
    its message, or else the input its node's output arrives through (a file a loader gives, refused by the
    bridge that reads it: high_noise_model), or quotes the value given (a file that does not match its pair)."""
    action, path = change
    if len(path) != 4 or path[0] != "prompt" or path[2] != "inputs" or action == "add":
        return True  # elsewhere: the message names a field of its own
    name, text = str(path[3]), answer["error"]
    if text.startswith("prompt: Dependency cycle detected") and f"{path[1]} (" in text:
        return True  # a link that closes a loop: ComfyUI's validation names the nodes of the loop
    through = {input_name for node in prompt.values() if isinstance(node, dict) and isinstance(node.get("inputs"), dict)
               for input_name, value in node["inputs"].items() if isinstance(value, list) and value[:1] == [path[1]]}
    value = prompt[path[1]]["inputs"].get(path[3])
    given = isinstance(value, str) and len(value) > 3 and repr(value)[1:-1][:100] in text  # its value, quoted
    return name in answer["input"] or name.split(".")[-1] in text or answer["input"] in through or given


@pytest.mark.fuzz_examples(1000, 5000)
def test_every_body_gets_a_split_or_a_400_naming_the_field(tiny_models_server, tiny_models, examples, fuzz_tally):
    bases = valid_bodies(tiny_models)
    before = [answer_of(tiny_models_server, json.dumps(body).encode()) for body in bases]
    assert all(status == 200 for status, _ in before), before
    near = near_values(tiny_models)

    @settings(max_examples=examples)
    @given(st.one_of(*(mutated(base, near=near) for base in bases)))
    def check(case):
        body, changes = case
        status, answer = answer_of(tiny_models_server, json.dumps(body, allow_nan=True).encode())
        fuzz_tally(str(status))
        if not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
            assert status == 400, answer
            return
        check_answer(status, answer, body)
        if status == 400 and len(changes) == 1:
            assert named_field(answer, changes[0], body.get("prompt")), (changes, answer)
    check()
    # The server answers the valid bodies as before: nothing a refused body did stayed behind.
    assert [answer_of(tiny_models_server, json.dumps(body).encode()) for body in bases] == before


@pytest.mark.fuzz_examples(200, 1000)
def test_a_body_that_is_not_a_request_gets_a_400(tiny_models_server, tiny_models, examples, fuzz_tally):
    """Bytes that are not JSON, JSON nested past any parser's depth, non-finite numbers, hostile texts."""
    first = valid_bodies(tiny_models)[0]
    before = answer_of(tiny_models_server, json.dumps(first).encode())
    deep = st.integers(1, 200_000).map(lambda depth: ("[" * depth + "]" * depth).encode())
    deep_objects = st.integers(1, 100_000).map(lambda depth: ('{"prompt":' * depth + "1" + "}" * depth).encode())
    texts = st.sampled_from(HOSTILE_TEXTS).map(lambda text: json.dumps(text).encode())
    numbers = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "1" * 5000]).map(str.encode)
    broken = st.binary(max_size=200) | st.text(max_size=200).map(str.encode)
    truncated = st.integers(0, len(json.dumps(first)) - 1).map(lambda n: json.dumps(first).encode()[:n])

    @settings(max_examples=examples)
    @given(deep | deep_objects | texts | numbers | broken | truncated)
    def check(data):
        status, answer = answer_of(tiny_models_server, data)
        fuzz_tally(str(status))
        assert status == 400 and answer["error"].startswith(f"{answer['input']}: "), answer
    check()
    assert answer_of(tiny_models_server, json.dumps(first).encode()) == before


def test_non_finite_numbers_in_a_valid_body_are_refused_by_name(tiny_models_server, tiny_models):
    high, low = expert_files(tiny_models)
    for name in ("flow_shift", "steps"):
        for value in (math.nan, math.inf, -math.inf):
            body = {"prompt": {"1": loader(high, low), "2": schedule("1", **{name: value})}, "nodes": ["2"]}
            status, answer = answer_of(tiny_models_server, json.dumps(body).encode())
            assert status == 400 and answer["input"] == name, (name, value, answer)
