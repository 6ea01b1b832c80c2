"""The live-split route's request check and the cutting of long values in error messages, fuzzed (no ComfyUI:
node types are given here; the route itself is fuzzed over HTTP in tests/in_comfyui/test_fuzz_route.py)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.fuzzing import json_values, mutated
from wan22_cachedit.nodes.core.errors import RUN_LIMIT, TEXT_LIMIT, Wan22InputError, cut
from wan22_cachedit.nodes.core.prompt_graph import check_request

OUTPUTS = {"Wan22ExpertLoader": 1, "Wan22Schedule": 5, "UNETLoader": 1}  # class_type -> output count

BASES = [  # requests the check takes, mutated below
    {"prompt": {"1": {"class_type": "Wan22ExpertLoader", "inputs": {"high_noise_model": "h", "low_noise_model": "l"}},
                "2": {"class_type": "Wan22Schedule", "inputs": {"experts": ["1", 0], "steps": 8}}}, "nodes": ["2"]},
    {"prompt": {"10": {"class_type": "UNETLoader", "inputs": {"unet_name": "h"}},
                "1": {"class_type": "Wan22ExpertLoader", "inputs": {"high_noise_model": ["10", 0]}},
                "2": {"class_type": "Wan22Schedule", "inputs": {"experts": ["1", 0]}},
                "3": {"class_type": "Wan22Schedule", "inputs": {"experts": ["1", 0], "schedule": ["2", 4]}}},
     "nodes": ["2", "3"]},
]
NEAR = ["1", "2", "10", "3", ["1", 0], ["2", 4], ["2", 5], ["1", 1], ["x", 0], ["1", -1], ["1", True], ["1"],
        "Wan22Schedule", "UNETLoader", "Unknown", {}, [], {"class_type": "UNETLoader"},
        {"class_type": "Wan22Schedule", "inputs": {"experts": ["2", 0]}}]
requests = st.one_of(*(mutated(base, near=NEAR).map(lambda case: case[0]) for base in BASES), json_values)

def readable(prompt: dict, ids: list) -> bool:
    """What ComfyUI's validation needs of the nodes the asked ones reach, stated apart from the walk in
    check_request."""
    reached, todo = set(), list(ids)
    while todo:
        node = prompt[todo.pop()]
        if not (isinstance(node, dict) and node.get("class_type") in OUTPUTS and isinstance(node.get("inputs"), dict)):
            return False
        for value in node["inputs"].values():
            if isinstance(value, list):
                if not (len(value) == 2 and isinstance(value[0], str) and value[0] in prompt
                        and type(value[1]) is int):
                    return False
                target = prompt[value[0]]
                kind = target.get("class_type") if isinstance(target, dict) else None
                if kind in OUTPUTS and not 0 <= value[1] < OUTPUTS[kind]:
                    return False
                if value[0] not in reached:
                    reached.add(value[0])
                    todo.append(value[0])
    return True


@pytest.mark.fuzz_examples(2000, 10000)
def test_every_request_is_taken_or_refused_naming_the_field(examples, fuzz_tally):
    @settings(max_examples=examples)
    @given(requests)
    def check(body):
        try:
            prompt, ids = check_request(body, OUTPUTS.get)
        except Wan22InputError as e:
            fuzz_tally("refused")
            assert e.input_name and str(e).startswith(f"{e.input_name}: ")
            assert e.input_name.split("[")[0].split(".")[0] in ("body", "prompt", "nodes")
            assert len(str(e)) <= TEXT_LIMIT
            return
        fuzz_tally("taken")
        assert prompt is body["prompt"] and ids == body["nodes"] and ids
        assert all(isinstance(i, str) and i in prompt for i in ids)
        assert readable(prompt, ids)
    check()


def test_the_two_bodies_of_the_report_are_refused_naming_the_field():
    bridge = {"prompt": {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": {"high": "x"}}},
                         "2": {"class_type": "Wan22Schedule", "inputs": {"experts": ["1", 0]}}}, "nodes": ["2"]}
    check_request(bridge, OUTPUTS.get)  # an object value is left to the node's own validation (a file name)
    loader = {"prompt": {"1": {"class_type": "Wan22ExpertLoader", "inputs": {"high_noise_model": [1, 2]}},
                         "2": {"class_type": "Wan22Schedule", "inputs": {"experts": ["1", 0]}}}, "nodes": ["2"]}
    with pytest.raises(Wan22InputError) as refused:
        check_request(loader, OUTPUTS.get)
    assert refused.value.input_name == "prompt['1'].inputs.high_noise_model"
    assert "a list is a link" in str(refused.value)


def test_a_request_deeper_than_the_node_limit_is_refused():
    prompt = {str(i): {"class_type": "Wan22Schedule", "inputs": {"experts": [str(i + 1), 0]}} for i in range(50)}
    prompt["50"] = {"class_type": "Wan22ExpertLoader", "inputs": {}}
    assert check_request({"prompt": prompt, "nodes": ["0"]}, OUTPUTS.get)[1] == ["0"]
    with pytest.raises(Wan22InputError, match="reach more than 20 nodes"):
        check_request({"prompt": prompt, "nodes": ["0"]}, OUTPUTS.get, max_nodes=20)


@pytest.mark.fuzz_examples(2000, 10000)
def test_cut_keeps_error_texts_short_and_short_texts_whole(examples):
    @settings(max_examples=examples)
    @given(st.text(max_size=50) | st.text(min_size=150, max_size=3000) | st.integers() | st.lists(st.text()))
    def check(value):
        text = cut(value)
        assert len(text) <= TEXT_LIMIT
        if len(str(value)) <= TEXT_LIMIT and all(len(w) <= RUN_LIMIT for w in str(value).split(" ")):
            assert text == str(value)
        for word in text.split(" "):
            assert len(word) <= RUN_LIMIT + len("…(1000000000 characters)")
    check()


def test_a_10000_character_name_is_cut_in_the_message():
    error = Wan22InputError("scheduler", f"{'z' * 10000!r} is not a scheduler")
    assert len(str(error)) < 200 and "…(10002 characters)" in str(error)
    assert json.dumps(str(error))  # a JSON answer carries it
