"""Reading an API-format prompt as a graph: which file a MODEL came from, and which node makes the experts a
node receives. The MODEL bridge reads its own prompt this way when it runs, and the canvas's live split
sends the prompt the frontend makes of the graph on screen (subgraphs flattened) so that the server reads it
the same way: the two never disagree, and the frontend restates none of it."""

from __future__ import annotations

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
