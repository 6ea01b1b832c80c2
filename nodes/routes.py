"""Two small routes on ComfyUI's server for the canvas.

- `POST /wan22/split`: the split each schedule node (and lead stage node) of the graph on screen will run,
  before anything is queued. The canvas sends the API prompt the frontend itself makes of the graph
  (subgraphs flattened, every widget value resolved) and the ids of its schedule nodes; the server asks the
  loader behind each one for its preview (`preview` on the loader's class, which its own validation uses) and
  counts the split with the schedule node's own function.
- `GET /wan22/canvas`: what the canvas needs to know of the nodes (the old sampler names a saved workflow may
  show, the nodes that show a split, what a workflow saved before an input was added runs with), so that the
  frontend restates none of it, and the operator's note (`WAN22_SERVER_NOTE`) if there is one.
"""

from __future__ import annotations

import inspect
import logging
import os

from aiohttp import web
from server import PromptServer

import execution
import nodes as comfyui_nodes

from . import schedule_nodes
from .core import schedule as core_schedule
from .core.errors import Wan22InputError, cut
from .core.experts import ExpertsPreview
from .core.prompt_graph import EXPERTS_INPUT, check_request, class_type, experts_source, is_link, node_inputs
from .types import ExpertsType

ROUTE = "/wan22/split"
CANVAS_ROUTE = "/wan22/canvas"
# An operator's note for every canvas this server serves, shown when the page opens and after a failed run
# (`make demo` says that only its workflow runs on its tiny stand-ins).
SERVER_NOTE = "WAN22_SERVER_NOTE"
SCHEDULE_INPUTS = ("sampler", "steps", "flow_shift", "scheduler")
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


def added_inputs() -> dict:
    """For each of the pack's nodes with inputs added after workflows were saved with it (its ADDED_INPUTS, each
    added after the ones before it): how many widget values the oldest such workflow has, and what the added
    widgets run with there, read from the node's schema (the widgets in their order). A workflow saved between
    two additions has more values; the canvas completes it from the same list."""
    found, pack = {}, __name__.rsplit(".", 1)[0] + "."
    for kind, node_class in comfyui_nodes.NODE_CLASS_MAPPINGS.items():
        added = getattr(node_class, "ADDED_INPUTS", None)
        if not added or not node_class.__module__.startswith(pack):
            continue
        declared = node_class.INPUT_TYPES()
        inputs = {**declared.get("required", {}), **declared.get("optional", {})}
        widgets = []
        for name, spec in inputs.items():
            if isinstance(spec[0], list) or spec[0] in WIDGET_TYPES:
                widgets.append(name)
                if has_control_widget(name, spec):
                    widgets.append(None)  # the frontend's control_after_generate value, saved after it
        first = min(widgets.index(name) for name in added)
        found[kind] = {"saved_length": first, "values": [added[name] for name in widgets[first:]]}
    return found


def has_control_widget(name: str, spec) -> bool:
    """Whether the frontend adds a control_after_generate widget after this input (an INT that asks for one, or
    one named seed or noise_seed that does not say otherwise), whose value a saved workflow holds too."""
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    control = options.get("control_after_generate")
    return spec[0] == "INT" and (bool(control) if control is not None else name in ("seed", "noise_seed"))


def passes_experts(kind: str) -> bool:
    """Whether a node type takes experts and gives experts back (Cache-DiT, LoRA, ...), read from its schema."""
    node_class = comfyui_nodes.NODE_CLASS_MAPPINGS.get(kind)
    if node_class is None or ExpertsType.io_type not in tuple(getattr(node_class, "RETURN_TYPES", ())):
        return False
    declared = node_class.INPUT_TYPES()
    inputs = {**declared.get("required", {}), **declared.get("optional", {})}
    return inputs.get(EXPERTS_INPUT, (None,))[0] == ExpertsType.io_type


def widget_value(inputs: dict, name: str, default=None):
    value = inputs.get(name, default)
    if is_link(value):
        raise Wan22InputError(name, "comes from another node: its value, and so the split, is known when the prompt "
                                    "runs")
    return value


def loaded_experts(prompt: dict, node_id: str) -> ExpertsPreview:
    """What the node that makes the experts will make, from its inputs in the prompt: the preview its own class
    answers (each loader's, which its validation uses too)."""
    node_class = comfyui_nodes.NODE_CLASS_MAPPINGS.get(class_type(prompt, node_id))
    preview = getattr(node_class, "preview", None)
    if preview is None:
        raise Wan22InputError("experts", "connect the experts input to a Wan2.2 expert loader")
    inputs = node_inputs(prompt, node_id)
    widgets = {name: widget_value(inputs, name) for name, parameter in inspect.signature(preview).parameters.items()
               if parameter.kind == parameter.POSITIONAL_OR_KEYWORD and name in inputs}
    return preview(prompt=prompt, node_id=node_id, **widgets)


SPLIT_NODES = ("Wan22Schedule", "Wan22LeadStage")  # the nodes whose split the canvas shows


def split_of(prompt: dict, node_id: str) -> dict:
    """What the schedule node (or lead stage node) `node_id` of the prompt will run."""
    schedule, known = schedule_of(prompt, node_id)
    return {**schedule_nodes.split_ui(schedule), "boundary_known": known, "summary": schedule.summary()}


def schedule_of(prompt: dict, node_id: str):
    """The schedule node `node_id` of the prompt makes (or the lead stage node makes of its schedule), and
    whether the model's boundary was read off the files."""
    kind = class_type(prompt, node_id)
    if kind == "Wan22LeadStage":
        inputs = node_inputs(prompt, node_id)
        upstream = inputs.get("schedule")
        if not is_link(upstream) or class_type(prompt, upstream[0]) != "Wan22Schedule":
            raise Wan22InputError("schedule", "connect a Wan2.2 Boundary & Flow Shift node to see the split")
        schedule, known = main_schedule_of(prompt, upstream[0])
        lead_source = experts_source(prompt, node_id, passes_experts)
        experts = None if lead_source is None else loaded_experts(prompt, lead_source)
        try:
            steps, start, cfg = (int(widget_value(inputs, "lead_steps")), int(widget_value(inputs, "start_step")),
                                 float(widget_value(inputs, "cfg")))
        except (TypeError, ValueError):
            raise Wan22InputError("lead_steps", "lead_steps, start_step and cfg must be numbers") from None
        return schedule_nodes.Wan22LeadStage.preview(schedule, experts, steps, start, cfg), known
    if kind != "Wan22Schedule":
        raise Wan22InputError("nodes", f"{cut(repr(node_id))} is not a Wan2.2 Boundary & Flow Shift or Lead Stage "
                                       "node of the prompt")
    return main_schedule_of(prompt, node_id)


def main_schedule_of(prompt: dict, node_id: str):
    source = experts_source(prompt, node_id, passes_experts)
    if source is None:
        raise Wan22InputError("experts", "connect a Wan2.2 expert loader to see the split")
    experts = loaded_experts(prompt, source)
    inputs = node_inputs(prompt, node_id)
    values = {name: widget_value(inputs, name) for name in SCHEDULE_INPUTS}
    boundary = {"boundary": widget_value(inputs, "boundary"),
                "boundary_ratio": widget_value(inputs, "boundary.boundary_ratio")}
    try:
        steps, flow_shift = int(values["steps"]), float(values["flow_shift"])
    except (TypeError, ValueError):
        raise Wan22InputError("steps", "steps and flow_shift must be numbers") from None
    schedule = schedule_nodes.Wan22Schedule.preview(experts, values["sampler"], steps, flow_shift, boundary,
                                                    values["scheduler"], widget_value(inputs, "boundary_ratio"))
    return schedule, experts.boundary_known


def outputs_of(kind: str) -> int | None:
    """How many outputs a node type of this server has, None for a type it does not have."""
    node_class = comfyui_nodes.NODE_CLASS_MAPPINGS.get(kind)
    return None if node_class is None else len(node_class.RETURN_TYPES)


VALIDATION_ID = "wan22-split"  # the prompt id ComfyUI's validation is given for the canvas's question


def refusal(prompt: dict, node_id: str, reason: dict, asked: str) -> dict:
    """One of ComfyUI's validation errors as the route answers it: the input (and the node, when it is one
    upstream of the asked node) named first, as the node's own refusal reads at queue time."""
    info = reason.get("extra_info") or {}
    name, message, details = str(info.get("input_name") or "prompt"), reason.get("message", ""), reason.get("details")
    if reason.get("type") == "custom_validation_failed" and " - " in str(details):
        # The node's own validator: its text names the input it refuses.
        text = str(details).split(" - ", 1)[1]
        name = text.split(":", 1)[0] if ":" in text else name
    else:
        text = f"{name}: {message}" + (f" ({details})" if details and details != name else "")
    if node_id != asked:
        text = f"{text} [on node {node_id}, {class_type(prompt, node_id)}]"
    return {"error": cut(text), "input": cut(name), "node": node_id}


async def validated(prompt: dict, node_id: str) -> dict | None:
    """ComfyUI's own validation of node `node_id` and everything it is linked to, as the prompt queue runs
    it (the nodes' schemas: types, ranges, choices, required inputs; their own validators): None when it
    passes, else the first refusal. The prompt's inputs get the values validation converts them to."""
    results = {}
    try:
        passed, reasons, _ = await execution.validate_inputs(VALIDATION_ID, prompt, node_id, results)
    except RecursionError:
        return {"error": "prompt: the graph upstream of this node is too deep to validate", "input": "prompt",
                "node": node_id}
    except Exception as e:  # a node's validator that fails (the prompt queue reports it the same way)
        return unexpected(e, node_id, "validating")
    if passed:
        return None
    for checked, (_, its_reasons, _) in [(node_id, (passed, reasons, node_id)), *results.items()]:
        if its_reasons:
            return refusal(prompt, checked, its_reasons[0], node_id)
    return {"error": "prompt: ComfyUI's validation refused this node", "input": "prompt", "node": node_id}


def unexpected(error: Exception, node_id: str, doing: str) -> dict:
    """An answer for an error nothing foresaw: logged with its traceback, answered by name, never a 500."""
    logging.exception("[wan22] the live split failed while %s node %r", doing, node_id)
    text = f"prompt: {doing} node {cut(repr(node_id))} raised {type(error).__name__}: {cut(error)} (see the server log)"
    return {"error": cut(text), "input": "prompt", "node": node_id}


def to_validate(prompt: dict) -> dict:
    """A copy of the prompt whose inputs ComfyUI's validation may convert (it writes them back)."""
    return {node_id: ({**node, "inputs": dict(node["inputs"])} if isinstance(node, dict)
                      and isinstance(node.get("inputs"), dict) else node) for node_id, node in prompt.items()}


def refused(error: Wan22InputError) -> web.Response:
    return web.json_response({"error": str(error), "input": error.input_name}, status=400)


@PromptServer.instance.routes.post(ROUTE)
async def split(request: web.Request) -> web.Response:
    """200 {"splits": {id: split}} when every asked node has its split; otherwise 400 with the first refusal
    ({"error", "input"}), and, once the body is a well-formed request, each asked node's split or refusal."""
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return refused(Wan22InputError("body", 'is not JSON: send {"prompt": <the API prompt>, "nodes": [ids]}'))
    try:
        prompt, ids = check_request(body, outputs_of)
    except Wan22InputError as e:
        return refused(e)
    prompt = to_validate(prompt)
    splits, first = {}, None
    for node_id in ids:
        answer = await validated(prompt, node_id)
        if answer is None:
            try:
                answer = split_of(prompt, node_id)
            except Wan22InputError as e:
                answer = {"error": str(e), "input": e.input_name, "node": node_id}
            except Exception as e:
                answer = unexpected(e, node_id, "counting the split of")
        splits[node_id] = answer
        first = first or ("error" in answer and answer)
    if not first:
        return web.json_response({"splits": splits})
    return web.json_response({**first, "splits": splits}, status=400)


@PromptServer.instance.routes.get(CANVAS_ROUTE)
async def canvas(_request: web.Request) -> web.Response:
    return web.json_response({"old_samplers": {old: new for old, new in core_schedule.OLD_SAMPLERS.items()
                                               if old != new}, "split_nodes": list(SPLIT_NODES),
                              "server_note": os.environ.get(SERVER_NOTE) or None, "added_inputs": added_inputs()})
