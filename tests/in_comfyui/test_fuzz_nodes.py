"""Every input of every pack node fuzzed through ComfyUI's own validation and execution: a generated value is
refused at validation with its input named, or it runs, or the run stops with an error whose message names
an input first; never an unnamed traceback. Afterwards the graph gives its normal, bit-identical result.

All pack nodes sit in one graph (`world`), each shown by a PreviewAny so that each runs; one executor runs
every case, so ComfyUI's cache re-runs only what a case changed (and what follows it)."""

import copy
import json
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from devtools.fuzzing import HOSTILE_NUMBERS, HOSTILE_TEXTS, json_values

from .prompts import cache_node, diffusers_loader, expert_files, lead_node, loader, lora_node, schedule, unet

# Values inside an input's range that a run on this machine cannot afford (a 16384-pixel video, 1000 steps)
# are drawn up to these caps; values outside the range are drawn whatever their size (validation refuses them).
AFFORDABLE = {"steps": 6, "lead_steps": 8, "start_step": 8, "width": 48, "height": 48, "length": 9, "batch_size": 2,
              "workers": 4, "ulysses_degree": 4, "cpu_threads": 4}
EXCEPTION_TYPES = ("exception_during_validation", "exception_during_inner_validation")
# ComfyUI's own refusals of a graph's shape: a node linked to itself, in a loop; no input of it is wrong.
GRAPH_REFUSALS = ("dependency_cycle",)
NAMED = re.compile(r"^[A-Za-z_][\w.]*: ")  # how a message names its input first: "flow_shift: ..."


def world(tiny_models, parallel_experts) -> dict:
    """One graph with every pack node, each run by a PreviewAny (ids "p<id>"); the parallel plan on the
    experts with two attention heads (a Ulysses degree of 2 needs heads to split)."""
    names, loras = tiny_models["names"], tiny_models["loras"]
    high, low = expert_files(tiny_models)
    nodes = {
        "1": loader(high, low),
        "10": unet(high), "11": unet(low),
        "12": {"class_type": "Wan22CacheDiTModel",
               "inputs": {"model": ["10", 0], "enabled": True, "residual_diff_threshold": 0.24,
                          "first_compute_blocks": 1, "last_compute_blocks": 0, "max_continuous_cached_steps": 3,
                          "warmup_steps": 1, "max_cached_steps": -1, "calibrator": "none"}},
        "13": {"class_type": "Wan22ExpertsFromModel", "inputs": {"high_noise_model": ["12", 0],
                                                                 "low_noise_model": ["11", 0]}},
        "14": diffusers_loader(names[("i2v", "diffusers")]),
        "40": lora_node("1", high=loras["high"], low=loras["low"], high_strength=0.5, low_strength=0.7),
        "20": cache_node("40", high_warmup_steps=1, low_warmup_steps=1),
        "2": schedule("20", sampler="euler", steps=4, flow_shift=5.0),
        "41": lead_node("2", "1", lead_steps=8, start_step=1),
        "3": {"class_type": "Wan22TextEncode", "inputs": {"model_folder": names[("t2v", "diffusers")],
                                                          "prompt": "a cat", "negative_prompt": "blurry"}},
        "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 32, "height": 32, "length": 1,
                                                                  "batch_size": 1}},
        "5": {"class_type": "Wan22TwoStageSampler",
              "inputs": {"experts": ["20", 0], "schedule": ["41", 0], "positive": ["3", 0], "negative": ["3", 1],
                         "latent_image": ["4", 0], "seed": 3, "cfg_high": 3.5, "cfg_low": 3.0}},
        # the error budget at 0 (no calibration run); a case that sets a budget calibrates on the 4-step run
        "21": {"class_type": "Wan22CacheBudget",
               "inputs": {"experts": ["20", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                          "latent_image": ["4", 0], "seed": 3, "cfg_high": 3.5, "cfg_low": 3.0, "error_budget": 0.0}},
        "51": loader(parallel_experts[("t2v", "high")], parallel_experts[("t2v", "low")]),
        "50": {"class_type": "Wan22ParallelPlan", "inputs": {"experts": ["51", 0], "workers": 2,
                                                             "devices": "cpu, cpu", "ulysses_degree": 2,
                                                             "cpu_threads": 1}},
    }
    nodes["15"] = schedule("13", sampler="uni_pc", steps=5, boundary="custom", boundary_ratio=0.9, scheduler="beta")
    nodes["16"] = schedule("14", sampler="dpmpp_2m", steps=3)
    shown = {"1": 0, "13": 0, "14": 0, "40": 0, "20": 0, "21": 1, "2": 1, "41": 1, "15": 2, "16": 1, "5": 1, "50": 0,
             "12": 0, "3": 0}
    for node_id, output in shown.items():
        nodes[f"p{node_id}"] = {"class_type": "PreviewAny", "inputs": {"source": [node_id, output]}}
    return nodes


def input_specs(comfyui, class_type: str) -> dict:
    """name -> (type, options) of every input of a node, as its schema gives it (a dynamic combo's inputs by
    their prompt names: boundary.boundary_ratio)."""
    schema = comfyui.nodes.NODE_CLASS_MAPPINGS[class_type].INPUT_TYPES()
    specs = {}
    for section in ("required", "optional"):
        for name, spec in schema.get(section, {}).items():
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            specs[name] = (spec[0], options)
            if spec[0] == "COMFY_DYNAMICCOMBO_V3":
                for option in options["options"]:
                    for inner in option["inputs"].values():
                        for inner_name, inner_spec in inner.items():
                            specs[f"{name}.{inner_name}"] = (inner_spec[0], inner_spec[1])
    return specs


def values_for(name: str, spec, near) -> st.SearchStrategy:
    """Values for one input: right-typed ones (in and out of its range), values of the wrong type, links."""
    kind, options = spec
    wrong = json_values | st.sampled_from(HOSTILE_NUMBERS) | st.sampled_from(HOSTILE_TEXTS) | st.sampled_from(near)
    if kind in ("INT", "FLOAT"):
        low, high = options.get("min", -2**63), options.get("max", 2**63)
        cap = min(high, AFFORDABLE.get(name, high))
        edges = [low, cap, low - 1, high + 1, high * 10 + 1, -high - 1]
        inside = st.integers(math.ceil(low), math.floor(cap)) if kind == "INT" else st.floats(low, cap)
        right = inside | st.sampled_from(edges) | st.sampled_from([float(low), str(low), str(cap)])
    elif kind == "BOOLEAN":
        right = st.booleans() | st.sampled_from([0, 1, "true", "false"])
    elif kind == "STRING":
        right = st.text(max_size=60) | st.sampled_from(["auto", "cpu", "cpu, cpu", "cuda:0", "cpu, cuda:7", "0,1"])
    elif kind == "COMBO" or kind == "COMFY_DYNAMICCOMBO_V3" or isinstance(kind, list):
        choices = options.get("options") or (kind if isinstance(kind, list) else [])
        choices = [c["key"] if isinstance(c, dict) else c for c in choices]
        right = st.sampled_from(choices) if choices else st.nothing()
    else:  # a link input
        right = st.sampled_from([v for v in near if isinstance(v, list)])
    return st.one_of(right, right, wrong)


def comfyui_node(class_type: str):
    import nodes

    return nodes.NODE_CLASS_MAPPINGS[class_type]


def near_values(tiny_models, prompt) -> list:
    """Other files, other choices, links to every output of the graph, broken links."""
    # Links to every output the graph has. A link to an output a node does not have is left out: ComfyUI's own
    # validation fails on it with an exception before any node is asked (the live route refuses it itself).
    outputs = {node_id: len(comfyui_node(node["class_type"]).RETURN_TYPES) for node_id, node in prompt.items()}
    links = [[node_id, i] for node_id, n in outputs.items() if not node_id.startswith("p") for i in range(n)]
    return [*tiny_models["names"].values(), *tiny_models["broken"].values(), *tiny_models["loras"].values(), "none",
            "unipc", "dpmpp", "custom", "auto", "taylorseer", *links, ["1", "0"], [1, 0], ["1"],
            ["nowhere", 0], ["1", 7], [None, None]]


@st.composite
def cases(draw, prompt, specs, near):
    """A change of one node of the graph: 1 to 3 of its inputs given a generated value or taken away."""
    node_id = draw(st.sampled_from(sorted(specs)))
    names = draw(st.lists(st.sampled_from(sorted(specs[node_id])), min_size=1, max_size=3, unique=True))
    changed = copy.deepcopy(prompt)
    inputs = changed[node_id]["inputs"]
    for name in names:
        if draw(st.integers(0, 9)) == 0:
            inputs.pop(name, None)
        else:
            inputs[name] = draw(values_for(name, specs[node_id][name], near))
    for name in [n for n in inputs if undeclared(n, inputs, specs[node_id]) and unfollowable(inputs[n], changed)]:
        inputs.pop(name)  # ComfyUI's own executor fails on it (test_comfyui_follows_an_undeclared_broken_link)
    return changed, node_id, names


def undeclared(name: str, inputs: dict, specs: dict) -> bool:
    """A dynamic combo's inner input (boundary.boundary_ratio) that the option its combo holds does not declare:
    to ComfyUI an input the node does not have, which its validation never reads."""
    parent, _, inner = name.partition(".")
    if not inner or parent not in specs:
        return False
    option = next((o for o in specs[parent][1].get("options", []) if o.get("key") == inputs.get(parent)), None)
    return option is None or not any(inner in section for section in option.get("inputs", {}).values())


def test_comfyui_follows_an_undeclared_broken_link(comfyui):
    """Why the cases leave out a broken link in an input the node does not declare (a dynamic combo's inner input
    its option lacks): ComfyUI 0.30.0 never validates such an input and its executor follows every link, so it
    raises where no node is asked, on its own nodes too (and a server's prompt worker would stop on it)."""
    from comfy_execution.graph import NodeNotFoundError

    prompt = {"1": {"class_type": "EmptyLatentImage",
                    "inputs": {"width": 64, "height": 64, "batch_size": 1, "not_an_input": ["nowhere", 0]}},
              "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}
    with pytest.raises(NodeNotFoundError):
        comfyui.run(prompt, executor=comfyui.new_executor())


# The PreviewAny texts compared: the splits (INT), the lead stage's sigmas, the sampler's report. The others
# show handles, whose text names objects by their address.
COMPARED_PREVIEWS = ("p2", "p15", "p16", "p41", "p5")


def results_of(comfyui, result, executor) -> tuple[dict, torch.Tensor]:
    """What the graph gave, to compare bit for bit: the pack nodes' own texts and the chosen previews of the
    nodes that ran (ComfyUI's history leaves out what came from its cache), and the sampler's latent."""
    shown = {node_id: without_seconds(output) for node_id, output in result.outputs.items()
             if not node_id.startswith("p") or node_id in COMPARED_PREVIEWS}
    if "p5" in shown:  # the report, but for how long things took
        shown["p5"] = without_seconds(json.loads(shown["p5"]["text"][0]))
    return shown, comfyui.cached_output("5", executor)[0][0]["samples"].clone()


def differences(got, expected, path=()) -> list:
    """Where two JSON-like values differ: [(path, got, expected)]."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return [d for k in sorted(set(got) | set(expected), key=str)
                for d in differences(got.get(k), expected.get(k), (*path, k))]
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return [d for i, (a, b) in enumerate(zip(got, expected)) for d in differences(a, b, (*path, i))]
    return [] if got == expected else [(path, got, expected)]


def without_seconds(value):
    """A value the nodes showed, but for how long things took (a report's seconds, "0.1 s" in a text)."""
    if isinstance(value, str):
        return re.sub(r"\b\d+(\.\d+)? s\b", "<time> s", value)
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if k not in ("seconds", "wall_seconds")}
    return [without_seconds(v) for v in value] if isinstance(value, list) else value


def unfollowable(link, prompt) -> bool:
    """A link ComfyUI's validation cannot follow (to a node the prompt lacks, an output it does not have): it
    fails on it with an exception of its own, naming the input, before any node is asked. The live route
    refuses such links itself (tests/core/test_fuzz_requests.py)."""
    if not isinstance(link, list) or len(link) != 2:
        return False
    target, index = link
    if not isinstance(target, str) or target not in prompt or not isinstance(index, int):
        return True
    outputs = len(comfyui_node(prompt[target]["class_type"]).RETURN_TYPES)
    return not -outputs <= index < outputs


def check_outcome(comfyui, result, prompt, specs):
    """A refusal names an input of its node and is no exception of ours; a failed run's message names an input
    first."""
    for node_id, entry in result.node_errors.items():
        for error in entry["errors"]:
            info = error.get("extra_info") or {}
            if error["type"] in GRAPH_REFUSALS:
                continue
            if error["type"] == "exception_during_inner_validation" and any(
                    unfollowable(value, prompt) for node in prompt.values() for value in node["inputs"].values()):
                assert info.get("input_name"), error  # raised where ComfyUI follows the link, on any node after it
                continue
            assert error["type"] not in EXCEPTION_TYPES, (node_id, error)
            named = (error.get("extra_info") or {}).get("input_name")
            known = specs.get(node_id) or input_specs(comfyui, prompt[node_id]["class_type"])
            assert named in known or NAMED.match(str(error.get("details"))), (node_id, error)
    if not result.valid:
        assert result.error["type"] not in EXCEPTION_TYPES, result.error
        return "refused"
    if result.success:
        return "refused in part, ran" if result.node_errors else "ran"
    failure = result.execution_error()
    assert NAMED.match(failure["exception_message"]), failure
    named = failure["exception_message"].split(":", 1)[0]
    node_specs = input_specs(comfyui, failure["node_type"])
    # A dynamic input is named as its widget is (boundary_ratio for boundary.boundary_ratio).
    assert named in node_specs or any(name.endswith(f".{named}") for name in node_specs), failure
    return "stopped naming an input"


@pytest.fixture(scope="module")
def graph(comfyui, tiny_models, parallel_experts, variant_experts):
    # variant_experts: the Fun-InP, Fun-Control, Fun-Camera and VACE-Fun files in the models folder, so that the
    # loaders' file inputs draw them too (run, or refused by name: unconditioned variants, mixed pairs)
    prompt = world(tiny_models, parallel_experts)
    specs = {node_id: input_specs(comfyui, node["class_type"]) for node_id, node in prompt.items()
             if comfyui_node(node["class_type"]).__module__.startswith(comfyui.pack_module.__name__)}
    pack = {name for name, node in comfyui.nodes.NODE_CLASS_MAPPINGS.items()
            if node.__module__.startswith(comfyui.pack_module.__name__)}
    assert {prompt[node_id]["class_type"] for node_id in specs} == pack and len(pack) == 12  # every pack node
    fresh = comfyui.new_executor()
    result = comfyui.run(prompt, executor=fresh)
    assert result.valid and result.success and not result.node_errors, (result.node_errors, result.execution_error())
    return prompt, specs, results_of(comfyui, result, fresh)


@pytest.mark.fuzz_examples(400, 3000)
def test_every_input_of_every_node_is_run_or_refused_by_name(comfyui, tiny_models, graph, examples, fuzz_tally):
    prompt, specs, expected = graph
    executor = comfyui.new_executor()
    near = near_values(tiny_models, prompt)

    @settings(max_examples=examples)
    @given(cases(prompt, specs, near))
    def check(case):
        changed, node_id, names = case
        result = comfyui.run(changed, executor=executor)
        fuzz_tally(check_outcome(comfyui, result, changed, specs))
    check()
    # The graph gives its normal result: on the executor every case ran on, and on a new one.
    for run_on in (executor, comfyui.new_executor()):
        result = comfyui.run(prompt, executor=run_on)
        assert result.success and not result.node_errors
        got = results_of(comfyui, result, run_on)
        assert torch.equal(got[1], expected[1])
        assert differences(got[0], {k: expected[0][k] for k in got[0]}) == []
    assert set(results_of(comfyui, result, run_on)[0]) == set(expected[0])  # the new one ran every node
