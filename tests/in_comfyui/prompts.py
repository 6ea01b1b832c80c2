"""API-format prompts, as the ComfyUI prompt queue takes them: the pack's graph and the official template's
native graph (two KSamplerAdvanced) on the same files, with the same node ids throughout.

Our graph: "1" the experts (a loader or the MODEL bridge; UNETLoaders "10"/"11", LoRAs "12"/"13"),
"2" the schedule, "3" the text, "4" the latent, "5" the sampler, "6" its report, "20" Cache-DiT, "40" LoRA.
The native graph: the same "3"/"4", UNETLoaders "10"/"11", LoRAs "12"/"13", ModelSamplingSD3 "14"/"15",
KSamplerAdvanced "16" (0 -> switch, leftover noise) and "17" (switch -> end).
"""

import torch

from wan22_cachedit.nodes.core.cache import CachePlan

TINY_VAE = "wan_2.1_vae.safetensors"


def expert_files(tiny, task="t2v", fmt="fp16") -> tuple[str, str]:
    """The tiny (high-noise, low-noise) expert files of a task, in one of the single-file formats."""
    return tiny["names"][(task, "high", fmt)], tiny["names"][(task, "low", fmt)]


def text_folder(tiny) -> str:
    """The tiny diffusers folder whose umt5 text encoder (and experts) the in-process prompts use."""
    return tiny["names"][("t2v", "diffusers")]
FINAL = {"ours": "5", "native": "17"}  # the node whose LATENT is the run's result


def loader(high="none", low="none", weight_dtype="default"):
    return {"class_type": "Wan22ExpertLoader",
            "inputs": {"high_noise_model": high, "low_noise_model": low, "weight_dtype": weight_dtype}}


def diffusers_loader(folder, experts="both", weight_dtype="default"):
    return {"class_type": "Wan22DiffusersExpertLoader",
            "inputs": {"model_folder": folder, "experts": experts, "weight_dtype": weight_dtype}}


def unet(name, weight_dtype="default"):
    return {"class_type": "UNETLoader", "inputs": {"unet_name": name, "weight_dtype": weight_dtype}}


def native_lora(model_from, name, strength=1.0):
    return {"class_type": "LoraLoaderModelOnly",
            "inputs": {"model": [model_from, 0], "lora_name": name, "strength_model": strength}}


def gguf_loaders(prompt: dict) -> dict:
    """The prompt with ComfyUI-GGUF's UnetLoaderGGUF in place of each UNETLoader (same node ids and files)."""
    return {k: ({"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": v["inputs"]["unet_name"]}}
                if v["class_type"] == "UNETLoader" else v) for k, v in prompt.items()}


def on_each_expert(prompt: dict, class_type: str, **inputs) -> dict:
    """The prompt with a MODEL node (`class_type`, its other inputs) right after each expert's loader ("10"
    high, "11" low), as "50" / "51": the same place in our graph and in the native one."""
    p = {k: {**v, "inputs": dict(v["inputs"])} for k, v in prompt.items()}
    for loader_id, node_id in (("10", "50"), ("11", "51")):
        if loader_id not in p:
            continue
        for node in p.values():
            for name, value in node["inputs"].items():
                if value == [loader_id, 0]:
                    node["inputs"][name] = [node_id, 0]
        p[node_id] = {"class_type": class_type, "inputs": {"model": [loader_id, 0], **inputs}}
    return p


def bridged(high=None, low=None, loras=None):
    """UNETLoader(s) -> (LoraLoaderModelOnly) -> Wan2.2 Experts from MODEL, as node "1"."""
    nodes, inputs = {}, {}
    for role, name, loader_id, lora_id in (("high", high, "10", "12"), ("low", low, "11", "13")):
        if name is None:
            continue
        nodes[loader_id] = unet(name)
        source = loader_id
        if loras and loras.get(role):
            nodes[lora_id] = native_lora(loader_id, *loras[role])
            source = lora_id
        inputs[f"{role}_noise_model"] = [source, 0]
    nodes["1"] = {"class_type": "Wan22ExpertsFromModel", "inputs": inputs}
    return nodes


def schedule(experts_from="1", sampler="uni_pc", steps=40, flow_shift=12.0, boundary="auto", boundary_ratio=0.875,
             scheduler="simple"):
    """The schedule node as the frontend writes it: the ratio is an input of the custom boundary only."""
    inputs = {"experts": [experts_from, 0], "sampler": sampler, "steps": steps, "flow_shift": flow_shift,
              "boundary": boundary, "scheduler": scheduler}
    if boundary == "custom":
        inputs["boundary.boundary_ratio"] = boundary_ratio
    return {"class_type": "Wan22Schedule", "inputs": inputs}


def schedule_prompt(experts, **schedule_inputs):
    """Experts (a node, or a dict of nodes with "1") -> schedule -> PreviewAny of high_steps (an output)."""
    nodes = experts if "1" in experts else {"1": experts}
    return {**nodes, "2": schedule("1", **schedule_inputs),
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}


def split_of(result, node="2"):
    s = result.outputs[node]["split"][0]
    return s["high"], s["low"]


# The node's default criterion (error, with a target chosen on the trained tuning bed) caches almost nothing on
# random experts, whose output changes a lot from step to step. The plumbing tests here cache with the threshold
# criterion at 0.6's default 0.24, which caches on random experts as the trained bed's 0.05 does on it (the error
# criterion's own tests set their targets).
RANDOM_WEIGHTS_THRESHOLD = 0.24
RANDOM_WEIGHTS_CACHE = {"residual_diff_threshold": RANDOM_WEIGHTS_THRESHOLD, "criterion": "threshold",
                        "high_warmup_steps": 4, "low_warmup_steps": 2}  # and the warm-ups saved with it


def cache_node(experts_from="1", **overrides):
    inputs = {**CachePlan().node_inputs(), **RANDOM_WEIGHTS_CACHE, **overrides}
    return {"class_type": "Wan22CacheDiT", "inputs": {"experts": [experts_from, 0], "enabled": True, **inputs}}


def lora_node(experts_from="1", high="none", low="none", high_strength=1.0, low_strength=1.0):
    return {"class_type": "Wan22LoraLoader",
            "inputs": {"experts": [experts_from, 0], "high_noise_lora": high, "high_noise_strength": high_strength,
                       "low_noise_lora": low, "low_noise_strength": low_strength}}


def inputs_of_a_run(text_folder, width=64, height=64, length=5, batch=1, prompt_text="a cat walks in the rain",
                    negative_text="blurry"):
    return {"3": {"class_type": "Wan22TextEncode",
                  "inputs": {"model_folder": text_folder, "prompt": prompt_text, "negative_prompt": negative_text}},
            "4": {"class_type": "EmptyHunyuanLatentVideo",
                  "inputs": {"width": width, "height": height, "length": length, "batch_size": batch}}}


def our_prompt(experts, text_folder, *, sampler="uni_pc", scheduler="simple", steps=8, flow_shift=12.0, seed=0,
               cfg=(4.0, 3.0), boundary="auto", boundary_ratio=0.875, cache=None, lora=None, decode=False,
               save_latent_prefix=None, **run):
    """`experts`: the node(s) giving "1". `cache` / `lora`: None for no such node, else the node's inputs
    (LoRA between the experts and the cache)."""
    p = {**(experts if "1" in experts else {"1": experts}), **inputs_of_a_run(text_folder, **run),
         "2": schedule("1", sampler=sampler, steps=steps, flow_shift=flow_shift, boundary=boundary,
                       boundary_ratio=boundary_ratio, scheduler=scheduler),
         "5": {"class_type": "Wan22TwoStageSampler",
               "inputs": {"experts": ["1", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                          "latent_image": ["4", 0], "seed": seed, "cfg_high": cfg[0], "cfg_low": cfg[1]}},
         "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 1]}}}
    last = "1"
    if lora is not None:
        p["40"] = lora_node(last, **lora)
        last = "40"
    if cache is not None:
        p["20"] = cache_node(last, **cache)
        last = "20"
    p["5"]["inputs"]["experts"] = [last, 0]
    if decode:
        p["7"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
        p["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["7", 0]}}
        p["9"] = {"class_type": "SaveAnimatedWEBP",
                  "inputs": {"images": ["8", 0], "filename_prefix": "wan22_test", "fps": 16.0, "lossless": False,
                             "quality": 80, "method": "default"}}
        p["19"] = {"class_type": "SaveImage", "inputs": {"images": ["5", 2], "filename_prefix": "wan22_timeline"}}
    if save_latent_prefix:
        p["11"] = {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": save_latent_prefix}}
    return p


def native_prompt(high, low, text_folder, *, switch, sampler="uni_pc", scheduler="simple", steps=8, flow_shift=12.0,
                  seed=0, cfg=(4.0, 3.0), loras=None, **run):
    """The official template's graph: UNETLoader -> (LoraLoaderModelOnly) -> ModelSamplingSD3 ->
    KSamplerAdvanced (0 -> switch, leftover noise) -> KSamplerAdvanced (switch -> end)."""
    p = {**inputs_of_a_run(text_folder, **run), "10": unet(high), "11": unet(low)}
    for role, loader_id, lora_id, shift_id in (("high", "10", "12", "14"), ("low", "11", "13", "15")):
        source = loader_id
        if loras and loras.get(role):
            p[lora_id] = native_lora(loader_id, *loras[role])
            source = lora_id
        p[shift_id] = {"class_type": "ModelSamplingSD3", "inputs": {"model": [source, 0], "shift": flow_shift}}
    common = {"noise_seed": seed, "steps": steps, "sampler_name": sampler, "scheduler": scheduler,
              "positive": ["3", 0], "negative": ["3", 1]}
    p["16"] = {"class_type": "KSamplerAdvanced",
               "inputs": {**common, "model": ["14", 0], "add_noise": "enable", "cfg": cfg[0], "latent_image": ["4", 0],
                          "start_at_step": 0, "end_at_step": switch, "return_with_leftover_noise": "enable"}}
    p["17"] = {"class_type": "KSamplerAdvanced",
               "inputs": {**common, "model": ["15", 0], "add_noise": "disable", "cfg": cfg[1], "latent_image": ["16",
                                                                                                                0],
                          "start_at_step": switch, "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
    p["18"] = {"class_type": "PreviewAny", "inputs": {"source": ["17", 0]}}
    return p


def one_ksampler_prompt(name, text_folder, *, sampler="euler", scheduler="simple", steps=6, flow_shift=5.0, seed=0,
                        cfg=4.0, **run):
    """One expert alone as people run it natively: UNETLoader -> ModelSamplingSD3 -> KSampler, result at "17"."""
    common = {"seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler, "scheduler": scheduler,
              "positive": ["3", 0], "negative": ["3", 1], "latent_image": ["4", 0], "denoise": 1.0}
    return {**inputs_of_a_run(text_folder, **run), "10": unet(name),
            "14": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["10", 0], "shift": flow_shift}},
            "17": {"class_type": "KSampler", "inputs": {**common, "model": ["14", 0]}},
            "18": {"class_type": "PreviewAny", "inputs": {"source": ["17", 0]}}}


def cache_model_node(model_from, **overrides):
    """Wan2.2 Cache-DiT (MODEL) on one MODEL, with the sampler's default plan for one expert unless told (at the
    random weights' threshold)."""
    plan = {**CachePlan().node_inputs(), **RANDOM_WEIGHTS_CACHE}
    inputs = {k: plan[k] for k in ("residual_diff_threshold", "first_compute_blocks", "last_compute_blocks",
                                   "max_continuous_cached_steps", "calibrator", "criterion", "error_target")}
    inputs.update(warmup_steps=plan["high_warmup_steps"], max_cached_steps=plan["high_max_cached_steps"])
    return {"class_type": "Wan22CacheDiTModel", "inputs": {"model": model_from, "enabled": True, **inputs,
                                                              **overrides}}


def model_node_statistics(comfyui, node: str, executor=None) -> dict:
    """What the Cache-DiT (MODEL) node's cache did in the last sample call of the MODEL node `node` returned (its
    stage cache's last_statistics, read off the SAMPLER_SAMPLE wrapper it put on that MODEL)."""
    stage_cache = comfyui.pack("nodes.stage_cache")
    model = comfyui.cached_output(node, executor)[0][0]
    return model.wrappers[stage_cache.WrappersMP.SAMPLER_SAMPLE][stage_cache.KEY][0].__self__.last_statistics


def with_model_caches(native: dict, high: dict | None = None, low: dict | None = None) -> dict:
    """The template's graph with a Cache-DiT MODEL node ("60" high, "61" low) between each expert's MODEL
    (after its LoRA) and its ModelSamplingSD3; None leaves an expert without one."""
    p = dict(native)
    for settings, shift_id, node_id in ((high, "14", "60"), (low, "15", "61")):
        if settings is None:
            continue
        p[shift_id] = {**p[shift_id], "inputs": {**p[shift_id]["inputs"]}}
        p[node_id] = cache_model_node(p[shift_id]["inputs"]["model"], **settings)
        p[shift_id]["inputs"]["model"] = [node_id, 0]
    return p


# --- three stages: a lead stage ("41") in front of the main schedule ---

def three_stage_prompt(tiny, *, lead_steps=24, start_step=1, lead_cfg=3.5, steps=8, flow_shift=5.0, sampler="euler",
                       scheduler="simple", cfg=(1.0, 1.0), lora=True, cache=None, experts=None, **run):
    """The three-stage LightX2V recipe on our nodes: the lead on the loader's experts ("1", no LoRA), the
    main stages on the LoRA node's ("40"), the lead node "41" between the schedule and the sampler.
    `experts`: (high, low) files, the tiny text-to-video ones unless given."""
    loras = tiny["loras"]
    p = our_prompt(loader(*(experts or expert_files(tiny))), text_folder(tiny), sampler=sampler, scheduler=scheduler,
                   steps=steps, flow_shift=flow_shift, cfg=cfg, cache=cache,
                   lora={"high": loras["high"], "low": loras["low"]} if lora else None, **run)
    p["41"] = lead_node(lead_steps=lead_steps, start_step=start_step, cfg=lead_cfg)
    p["5"]["inputs"]["schedule"] = ["41", 0]
    return p


def lead_node(schedule_from="2", experts_from="1", lead_steps=24, start_step=1, cfg=3.5):
    return {"class_type": "Wan22LeadStage",
            "inputs": {"schedule": [schedule_from, 0], "experts": [experts_from, 0], "lead_steps": lead_steps,
                       "start_step": start_step, "cfg": cfg}}


def native_three_ksamplers(tiny, *, switch, lead_steps=24, lead_end=3, start_step=1, lead_cfg=3.5, steps=8,
                           flow_shift=5.0, sampler="euler", scheduler="simple", cfg=(1.0, 1.0), seed=0, lora=True,
                           experts=None, **run):
    """The three-stage recipe as people build it by hand: the template's graph with the LightX2V LoRAs (unless
    `lora` is False), and a KSamplerAdvanced "20" in front on the high-noise expert without them ("21": its
    ModelSamplingSD3), steps 0 to `lead_end` of its own `lead_steps`; the main high stage "16" then runs from
    `start_step`. `experts`: as three_stage_prompt's."""
    loras = tiny["loras"]
    p = native_prompt(*(experts or expert_files(tiny)), text_folder(tiny), switch=switch, sampler=sampler,
                      scheduler=scheduler, steps=steps, flow_shift=flow_shift, seed=seed, cfg=cfg,
                      loras={"high": (loras["high"], 1.0), "low": (loras["low"], 1.0)} if lora else None, **run)
    p["21"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["10", 0], "shift": flow_shift}}
    p["20"] = {"class_type": "KSamplerAdvanced",
               "inputs": {**{k: p["16"]["inputs"][k] for k in ("noise_seed", "sampler_name", "scheduler", "positive",
                                                                "negative")},
                          "model": ["21", 0], "add_noise": "enable", "steps": lead_steps, "cfg": lead_cfg,
                          "latent_image": ["4", 0], "start_at_step": 0, "end_at_step": lead_end,
                          "return_with_leftover_noise": "enable"}}
    p["16"]["inputs"].update(add_noise="disable", latent_image=["20", 0], start_at_step=start_step)
    return p


# --- the stack tests: our graph and the native one with the same MODEL node, on random weights ---

CACHING = {"residual_diff_threshold": 0.9, "high_warmup_steps": 1, "low_warmup_steps": 1}  # caches on both experts
NEVER = {"residual_diff_threshold": 0.001, "high_warmup_steps": 1, "low_warmup_steps": 1}  # installed, caches none
STACK_RUN = dict(sampler="euler", steps=10, flow_shift=5.0, seed=6, width=32, height=32, length=1)


def stack_graphs(tiny, cache, run=None, fmt="fp16", **node):
    """(ours, native) on the bridge, with `node` ({"class_type": ..., inputs}) after each expert's loader; the
    native switch is set by equals_native from our run's split."""
    high, low = expert_files(tiny, fmt=fmt)
    run = {**STACK_RUN, **(run or {})}
    ours = our_prompt(bridged(high, low), text_folder(tiny), cache=cache, **run)
    native = native_prompt(high, low, text_folder(tiny), switch=None, **run)
    if node:
        kind = node.pop("class_type")
        ours, native = on_each_expert(ours, kind, **node), on_each_expert(native, kind, **node)
    return ours, native


def equals_native(comfyui, ours, native, nothing_cached=True) -> dict:
    """Runs both (the native one switching where ours did); asserts the latents are equal and, unless told,
    that the cache was installed and cached nothing; returns our report."""
    report = report_of(run_ok(comfyui, ours))
    latent = latent_of(comfyui, FINAL["ours"])
    native["16"]["inputs"]["end_at_step"] = native["17"]["inputs"]["start_at_step"] = report["split"]["high"]
    run_ok(comfyui, native)
    assert torch.equal(latent, latent_of(comfyui, FINAL["native"]))
    if nothing_cached:
        assert all(report["cache"][r]["cached"] and not report["cache"][r]["cached_steps"] for r in ("high", "low"))
    return report


def cached_evaluations(report) -> int:
    """The evaluations both experts' caches served, both passes counted."""
    return sum(len(report["cache"][role]["cached_steps"]) + len(report["cache"][role]["cfg_cached_steps"])
               for role in ("high", "low"))


def with_start_image(prompt, sampler_node, with_image=True):
    """The run's text and latent through native WanImageToVideo (a start image, a tiny Wan VAE)."""
    prompt["112"] = {"class_type": "LoadImage", "inputs": {"image": "wan22_start.png"}}
    prompt["113"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    prompt["114"] = {"class_type": "WanImageToVideo",
                     "inputs": {"positive": ["3", 0], "negative": ["3", 1], "vae": ["113", 0], "width": 64,
                                "height": 64, "length": 5, "batch_size": 1}}
    if with_image:
        prompt["114"]["inputs"]["start_image"] = ["112", 0]
    for node in sampler_node:
        prompt[node]["inputs"].update(positive=["114", 0], negative=["114", 1])
    prompt[sampler_node[0]]["inputs"]["latent_image"] = ["114", 2]
    return prompt


# --- running them ---

def run_ok(comfyui, prompt, executor=None):
    result = comfyui.run(prompt, executor=executor)
    assert result.valid, result.node_errors
    assert result.success, result.execution_error()
    return result


def report_of(result, node="5"):
    return result.outputs[node]["report"][0]


def latent_of(comfyui, node, executor=None):
    """The LATENT samples a node returned in the last run (a copy)."""
    return comfyui.cached_output(node, executor)[0][0]["samples"].clone()


def refused_at_queue(comfyui, prompt, node="1"):
    """The node errors ComfyUI's validation gives `node`, as one string."""
    result = comfyui.run(prompt)
    assert not result.valid, "the prompt should have been refused"
    assert node in result.node_errors, result.node_errors
    return " | ".join(result.node_error_details(node))


def failed_at_run(comfyui, prompt):
    """The message of the error a valid prompt fails with."""
    result = comfyui.run(prompt, executor=comfyui.new_executor())
    assert result.valid, result.node_errors
    assert not result.success
    return result.execution_error()["exception_message"]


def diffusion_models(comfyui, node="1", executor=None) -> dict:
    """The shared diffusion models of the experts node `node` made in the executor's last run, by role (none
    before it has run): what every clone of those experts runs, and what nothing may be left on."""
    output = comfyui.cached_output(node, executor)
    if output is None:
        return {}
    return {role: model.model.diffusion_model for role, model in output[0][0].models().items()}


def two_samplers_in_one_graph(comfyui, first, second, executor):
    """Runs one graph: `first`, plus `second`'s sampler as node "30" on the same loaded experts (with
    whatever nodes of `second` the first lacks, its Cache-DiT or LoRA node); returns the latents of the
    first's sampler ("5") and the second's ("30")."""
    import copy

    both = copy.deepcopy(first)
    both.update({k: copy.deepcopy(v) for k, v in second.items() if k not in both})
    both["30"] = copy.deepcopy(second["5"])
    both["31"] = {"class_type": "PreviewAny", "inputs": {"source": ["30", 1]}}
    run_ok(comfyui, both, executor)
    return latent_of(comfyui, "5", executor), latent_of(comfyui, "30", executor)


# --- the Wan2.2 variants' own conditioning nodes, on one image ---

CONDITIONING = {  # ComfyUI's node for each variant, and its image inputs
    "fun_inpaint": ("WanFunInpaintToVideo", ("start_image",)),
    "fun_control": ("Wan22FunControlToVideo", ("ref_image", "control_video")),
    "fun_camera": ("WanCameraImageToVideo", ("start_image",)),
    "vace": ("WanVaceToVideo", ("control_video", "reference_image")),
}
TRIMMED = {"ours": "120", "native": "121"}  # VACE: the result after TrimVideoLatent, as ComfyUI's template trims it


def conditioned(prompt, samplers, variant, image):
    kind, images = CONDITIONING[variant]
    p = dict(prompt)
    p["112"] = {"class_type": "LoadImage", "inputs": {"image": image}}
    p["113"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    p["114"] = {"class_type": kind, "inputs": {"positive": ["3", 0], "negative": ["3", 1], "vae": ["113", 0],
                                               "width": 64, "height": 64, "length": 5, "batch_size": 1,
                                               **{name: ["112", 0] for name in images}}}
    if variant == "fun_camera":  # ComfyUI's camera path for the same size
        p["115"] = {"class_type": "WanCameraEmbedding", "inputs": {"camera_pose": "Zoom In", "width": 64, "height": 64,
                                                                   "length": 5}}
        p["114"]["inputs"]["camera_conditions"] = ["115", 0]
    if variant == "vace":  # the reference image's latent frame leads the output: trimmed after the sampling
        p["114"]["inputs"]["strength"] = 1.0
        final = samplers[-1]
        trim = TRIMMED["ours" if final == FINAL["ours"] else "native"]
        p[trim] = {"class_type": "TrimVideoLatent", "inputs": {"samples": [final, 0], "trim_amount": ["114", 3]}}
        p[trim + "1"] = {"class_type": "PreviewAny", "inputs": {"source": [trim, 0]}}  # an output: it runs
    for node in samplers:
        p[node] = {**p[node], "inputs": {**p[node]["inputs"], "positive": ["114", 0], "negative": ["114", 1]}}
    p[samplers[0]]["inputs"]["latent_image"] = ["114", 2]
    return p
