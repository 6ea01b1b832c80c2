"""API-format prompts for the pack's nodes, as the ComfyUI prompt queue takes them."""


def loader(high="none", low="none", weight_dtype="fp32"):
    return {"class_type": "Wan22ExpertLoader",
            "inputs": {"high_noise_model": high, "low_noise_model": low, "weight_dtype": weight_dtype}}


def diffusers_loader(folder, experts="both", weight_dtype="fp32"):
    return {"class_type": "Wan22DiffusersExpertLoader",
            "inputs": {"model_folder": folder, "experts": experts, "weight_dtype": weight_dtype}}


def schedule(experts_from="1", sampler="unipc", steps=40, flow_shift=12.0, boundary="auto", boundary_ratio=0.875):
    return {"class_type": "Wan22Schedule",
            "inputs": {"experts": [experts_from, 0], "sampler": sampler, "steps": steps, "flow_shift": flow_shift,
                       "boundary": boundary, "boundary_ratio": boundary_ratio}}


def schedule_prompt(loader_node, **schedule_inputs):
    """Loader -> schedule -> native PreviewAny of high_steps (an output node, so the graph runs)."""
    return {"1": loader_node, "2": schedule("1", **schedule_inputs),
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}


def split_of(result, node="2"):
    s = result.outputs[node]["split"][0]
    return s["high"], s["low"]
