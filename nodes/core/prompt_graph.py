"""Reading an API-format prompt as a graph: which file a MODEL came from, and which node makes the experts a
node receives. The MODEL bridge reads its own prompt this way when it runs, and the canvas's live split
sends the prompt the frontend makes of the graph on screen (subgraphs flattened) so that the server reads it
the same way: the two never disagree, and the frontend restates none of it."""

from __future__ import annotations

from .errors import Wan22InputError, cut

# Inputs that name a model file on ComfyUI's loaders (Load Diffusion Model and GGUF loaders: unet_name;
# checkpoint loaders: ckpt_name), and the input through which a node passes a MODEL along.
FILE_INPUTS = ("unet_name", "ckpt_name")
MODEL_INPUT = "model"
EXPERTS_INPUT = "experts"
MAX_HOPS = 64


def is_link(value) -> bool:
    """An input linked to another node's output: [node id, output index]."""
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool))


def node_inputs(prompt: dict, node_id) -> dict:
    node = prompt.get(node_id) if isinstance(prompt, dict) and isinstance(node_id, str) else None
    inputs = node.get("inputs") if isinstance(node, dict) else None
    return inputs if isinstance(inputs, dict) else {}


def class_type(prompt: dict, node_id) -> str | None:
    node = prompt.get(node_id) if isinstance(prompt, dict) and isinstance(node_id, str) else None
    kind = node.get("class_type") if isinstance(node, dict) else None
    return kind if isinstance(kind, str) else None


def upstream_file(prompt: dict, node_id: str, input_name: str) -> str | None:
    """The file behind `input_name` of node `node_id`, or None when the chain of MODEL inputs ends elsewhere
    (a node that makes a MODEL from no file, an input that is not linked)."""
    value = node_inputs(prompt, node_id).get(input_name)
    for _ in range(MAX_HOPS):
        if not is_link(value):
            return None
        inputs = node_inputs(prompt, value[0])
        for name in FILE_INPUTS:
            if isinstance(inputs.get(name), str):
                return inputs[name]
        value = inputs.get(MODEL_INPUT)
    return None


def experts_source(prompt: dict, node_id: str, passes_experts) -> str | None:
    """The id of the node that makes the experts `node_id` receives on its experts input, through the nodes
    that take experts and give experts back (`passes_experts(class_type)`: Cache-DiT, LoRA, ...); None when
    that input is not linked."""
    value = node_inputs(prompt, node_id).get(EXPERTS_INPUT)
    for _ in range(MAX_HOPS):
        if not is_link(value) or class_type(prompt, value[0]) is None:
            return None
        if not passes_experts(class_type(prompt, value[0])):
            return value[0]
        value = node_inputs(prompt, value[0]).get(EXPERTS_INPUT)
    return None


# --- requests from outside: the canvas's live split, or any client ---

MAX_NODES = 2000  # nodes a request may reach from the ones it asks about (a real graph has a few dozen)


def field(node_id: str, *path: str) -> str:
    """How an error names a place in the request's prompt: prompt["2"].inputs.steps."""
    return "".join([f"prompt[{cut(repr(node_id))}]", *(f".{cut(name)}" for name in path)])


def link_problem(value: list, prompt: dict, outputs_of) -> str | None:
    """Why a list input of the prompt is not a link ComfyUI can follow ([node id, output index] to a node
    the prompt has, of a known type, with that output), or None."""
    if len(value) != 2 or not isinstance(value[0], str) or not isinstance(value[1], int) or isinstance(value[1],
                                                                                                      bool):
        return "a list is a link: give [node id (a string), output index (a whole number)]"
    if value[0] not in prompt:
        return f"links to node {cut(repr(value[0]))}, which the prompt does not have"
    node = prompt[value[0]]  # itself checked when the walk reaches it
    kind = node.get("class_type") if isinstance(node, dict) else None
    outputs = outputs_of(kind) if isinstance(kind, str) else None
    if outputs is not None and not 0 <= value[1] < outputs:
        return f"links to output {value[1]} of node {cut(repr(value[0]))}, which has {outputs} outputs"
    return None


def check_request(body, outputs_of, max_nodes: int = MAX_NODES) -> tuple[dict, list[str]]:
    """The prompt and the asked node ids of a request {"prompt": API prompt, "nodes": [ids]}, once the
    request is one ComfyUI's validation can read: every node the asked ones reach through links is an object
    of a node type this server has (`outputs_of(class_type)`: its output count, or None for an unknown
    type) with an inputs object, and every link points at an output that exists. Anything else is refused
    with a Wan22InputError naming the field (prompt["2"].inputs.experts); values themselves are left to the
    nodes' own validation."""
    if not isinstance(body, dict):
        raise Wan22InputError("body", 'send a JSON object: {"prompt": <the API prompt>, "nodes": [node ids]}')
    prompt, ids = body.get("prompt"), body.get("nodes")
    if not isinstance(prompt, dict):
        raise Wan22InputError("prompt", "give the API prompt of the graph (app.graphToPrompt), an object of nodes")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise Wan22InputError("nodes", "give the ids of the schedule nodes, a list of strings")
    if len(ids) > max_nodes:
        raise Wan22InputError("nodes", f"{len(ids)} ids: ask for at most {max_nodes}")
    for node_id in ids:
        if node_id not in prompt:
            raise Wan22InputError("nodes", f"{cut(repr(node_id))} is not a node of the prompt")
    seen, todo = set(), list(ids)
    while todo:
        node_id = todo.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        if len(seen) > max_nodes:
            raise Wan22InputError("prompt", f"the asked nodes reach more than {max_nodes} nodes")
        node = prompt[node_id]
        if not isinstance(node, dict):
            raise Wan22InputError(field(node_id), "a node is an object with class_type and inputs")
        kind = node.get("class_type")
        if not isinstance(kind, str):
            raise Wan22InputError(field(node_id, "class_type"), "give the node type, a string")
        if outputs_of(kind) is None:
            raise Wan22InputError(field(node_id, "class_type"), f"{cut(repr(kind))} is not a node type of this "
                                                                "server: install the custom node that has it")
        inputs = node.get("inputs")
        if not isinstance(inputs, dict):
            raise Wan22InputError(field(node_id, "inputs"), "give the node's inputs, an object of input names")
        for name, value in inputs.items():
            if isinstance(value, list):
                problem = link_problem(value, prompt, outputs_of)
                if problem:
                    raise Wan22InputError(field(node_id, "inputs", name), problem)
                todo.append(value[0])
    return prompt, ids
