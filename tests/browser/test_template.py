"""ComfyUI's own Wan2.2 14B text-to-video template, taken from the installed templates package and converted
by the real frontend: with its two KSamplerAdvanced replaced by our schedule and sampler, fed by its own
loader and LoRA nodes, it gives bit for bit the latent it gives unmodified (on stand-ins named as its files);
and our nodes put inside its subgraph show the split on the canvas."""

import copy
import json
import os

import pytest
import torch

from devtools.comfy_server import run_and_load

from .canvas import frontend_prompt, load, node_of, set_widget, wait_for_status


def template_path() -> str:
    import comfyui_workflow_templates_json

    return os.path.join(os.path.dirname(comfyui_workflow_templates_json.__file__), "templates",
                        "video_wan2_2_14B_t2v.json")


def lightning_template_at_a_tiny_size() -> dict:
    """The template with its own "Enable Lightning LoRA" switch on (4 steps, CFG 1, switch at step 2, the
    LightX2V LoRAs), at 64x64 and 5 frames (length = floor(16 fps x 0.25 s) + 1). Nothing else changes."""
    with open(template_path(), encoding="utf-8") as f:
        template = json.load(f)
    (subgraph,) = template["definitions"]["subgraphs"]
    nodes = {n.get("title") or n["type"]: n for n in subgraph["nodes"]}
    nodes["Enable Lightning LoRA"]["widgets_values"][0] = True
    nodes["Float (Duration)"]["widgets_values"][0] = 0.25
    nodes["EmptyHunyuanLatentVideo"]["widgets_values"][:2] = [64, 64]
    return template


def the_two_ksamplers(prompt: dict) -> tuple[str, str]:
    ids = [k for k, v in prompt.items() if v["class_type"] == "KSamplerAdvanced"]
    (high,) = [k for k in ids if prompt[k]["inputs"]["add_noise"] == "enable"]
    (low,) = [k for k in ids if k != high]
    return high, low


def with_our_schedule_and_sampler(prompt: dict) -> dict:
    """The same graph with our nodes where its two KSamplerAdvanced (and their ModelSamplingSD3) were: the
    MODELs the template's LoRA nodes give feed our bridge; steps, sampler, scheduler, shift, seed and CFGs are
    the template's own (the same links or values)."""
    ours = copy.deepcopy(prompt)
    high_id, low_id = the_two_ksamplers(ours)
    high, low = ours.pop(high_id)["inputs"], ours.pop(low_id)["inputs"]
    high_shift, low_shift = ours.pop(high["model"][0]), ours.pop(low["model"][0])
    assert high_shift["class_type"] == low_shift["class_type"] == "ModelSamplingSD3"
    assert high_shift["inputs"]["shift"] == low_shift["inputs"]["shift"]
    ours["900"] = {"class_type": "Wan22ExpertsFromModel",
                   "inputs": {"high_noise_model": high_shift["inputs"]["model"],
                              "low_noise_model": low_shift["inputs"]["model"]}}
    ours["901"] = {"class_type": "Wan22Schedule",
                   "inputs": {"experts": ["900", 0], "sampler": high["sampler_name"], "scheduler": high["scheduler"],
                              "steps": high["steps"], "flow_shift": high_shift["inputs"]["shift"], "boundary": "auto",
                              "boundary_ratio": 0.875}}
    ours["902"] = {"class_type": "Wan22TwoStageSampler",
                   "inputs": {"experts": ["900", 0], "schedule": ["901", 0], "positive": high["positive"],
                              "negative": high["negative"], "latent_image": high["latent_image"],
                              "seed": high["noise_seed"], "cfg_high": high["cfg"], "cfg_low": low["cfg"]}}
    for node in ours.values():  # whatever read the second KSamplerAdvanced's latent reads ours
        for name, value in node["inputs"].items():
            if value == [low_id, 0]:
                node["inputs"][name] = ["902", 0]
    return ours


def saving_the_latent(prompt: dict, source: list, prefix: str) -> dict:
    return {**prompt, "999": {"class_type": "SaveLatent", "inputs": {"samples": source, "filename_prefix": prefix}}}


RUNS = {}  # prompt -> (latent, history entry): a frontend that converts the template alike gets the same run


def run_for_latent(server, prompt: dict) -> tuple[torch.Tensor, dict]:
    key = json.dumps(prompt, sort_keys=True)
    if key not in RUNS:
        RUNS[key] = run_and_load(server, prompt)
    return RUNS[key]


@pytest.fixture(scope="module")
def template_prompt(page):
    load(page, lightning_template_at_a_tiny_size())
    return frontend_prompt(page)


def test_the_template_converts_to_its_two_ksamplers_with_the_lightning_set_up(template_prompt):
    high, low = (template_prompt[k]["inputs"] for k in the_two_ksamplers(template_prompt))
    assert (high["sampler_name"], high["scheduler"], high["start_at_step"]) == ("euler", "simple", 0)
    assert (high["return_with_leftover_noise"], low["add_noise"]) == ("enable", "disable")
    loras = sorted(v["inputs"]["lora_name"] for v in template_prompt.values()
                   if v["class_type"] == "LoraLoaderModelOnly")
    assert loras == ["wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
                     "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"]


def test_our_schedule_and_sampler_in_the_official_template_give_its_latent_bit_for_bit(template_prompt,
                                                                                       native_text_server):
    _, low_id = the_two_ksamplers(template_prompt)
    theirs, _ = run_for_latent(native_text_server, saving_the_latent(template_prompt, [low_id, 0], "template/theirs"))
    ours_prompt = with_our_schedule_and_sampler(template_prompt)
    ours, entry = run_for_latent(native_text_server, saving_the_latent(ours_prompt, ["902", 0], "template/ours"))
    report = entry["outputs"]["902"]["report"][0]
    # The switch the template types at step 2 is the one the boundary gives on its own sigmas.
    assert report["split"] == {"high": 2, "low": 2} and report["sigmas"] == [1.0, 0.9375, 0.833333, 0.625, 0.0]
    assert [u["file"] for u in report["loras"]["high"]] == []  # the LoRAs are the template's own nodes
    assert theirs.shape == (1, 16, 2, 8, 8) and torch.equal(ours, theirs)


def with_model_caches(prompt: dict, **settings) -> dict:
    """The template's prompt with a Wan2.2 Cache-DiT (MODEL) node between each ModelSamplingSD3 and its
    KSamplerAdvanced."""
    ours = copy.deepcopy(prompt)
    for i, sampler in enumerate(the_two_ksamplers(ours)):
        node_id = f"95{i}"
        ours[node_id] = {"class_type": "Wan22CacheDiTModel",
                         "inputs": {"model": ours[sampler]["inputs"]["model"], "enabled": True,
                                    "residual_diff_threshold": 0.8, "first_compute_blocks": 1, "last_compute_blocks": 0,
                                    "max_continuous_cached_steps": -1, "warmup_steps": 0, "max_cached_steps": -1,
                                    "calibrator": "none", **settings}}
        ours[sampler]["inputs"]["model"] = [node_id, 0]
    return ours


def test_the_cache_dit_model_node_in_the_official_template_off_is_the_template_bit_for_bit(template_prompt,
                                                                                          native_text_server):
    """One Cache-DiT MODEL node per expert in ComfyUI's own template, as the frontend converts it: on, the
    cache serves steps (2 + 2 LightX2V steps, warm-up 0); off, the latent is the template's own."""
    _, low_id = the_two_ksamplers(template_prompt)
    theirs, _ = run_for_latent(native_text_server, saving_the_latent(template_prompt, [low_id, 0], "template/theirs"))
    cached, entry = run_for_latent(native_text_server, saving_the_latent(with_model_caches(template_prompt),
                                                                         [low_id, 0], "template/model_cache"))
    assert all("a context of its own for each sample call" in entry["outputs"][n]["text"][0] for n in ("950", "951"))
    assert not torch.equal(cached, theirs)
    off, _ = run_for_latent(native_text_server, saving_the_latent(with_model_caches(template_prompt, enabled=False),
                                                                  [low_id, 0], "template/model_cache_off"))
    assert torch.equal(off, theirs)


# Our bridge and schedule inside the template's subgraph, fed by its LoRA nodes (which its subgraph inputs feed
# with the file names shown on the subgraph node).
INSIDE_THE_SUBGRAPH_JS = """
async () => {
  const subgraph = [...app.rootGraph.subgraphs.values()][0];
  const lora = (name) => subgraph.nodes.find(n => n.type === 'LoraLoaderModelOnly'
                                              && n.widgets.find(w => w.name === 'lora_name').value.includes(name));
  const bridge = LiteGraph.createNode('Wan22ExpertsFromModel');
  const schedule = LiteGraph.createNode('Wan22Schedule');
  subgraph.add(bridge);
  subgraph.add(schedule);
  lora('high_noise').connect(0, bridge, bridge.findInputSlot('high_noise_model'));
  lora('low_noise').connect(0, bridge, bridge.findInputSlot('low_noise_model'));
  bridge.connect(0, schedule, schedule.findInputSlot('experts'));
}
"""


def test_our_nodes_inside_the_official_templates_subgraph_show_the_split(page):
    load(page, lightning_template_at_a_tiny_size())
    page.evaluate(INSIDE_THE_SUBGRAPH_JS)
    for name, value in (("sampler", "euler"), ("steps", 4), ("flow_shift", 5.0)):
        set_widget(page, "Wan22Schedule", name, value)
    assert wait_for_status(page, "Wan22Schedule", "will run: 2 high") == \
        "will run: 2 high / 2 low (boundary 0.875, model default)"
    workflow = json.loads(page.evaluate("() => JSON.stringify(app.rootGraph.serialize())"))  # as a save writes it
    load(page, {"nodes": [], "links": [], "version": 0.4})  # away, then back as a saved workflow is opened
    load(page, workflow)
    assert wait_for_status(page, "Wan22Schedule", "will run:").startswith("will run: 2 high / 2 low")
    set_widget(page, "Wan22Schedule", "steps", 8)  # inside the subgraph, a change still reaches the canvas
    wait_for_status(page, "Wan22Schedule", "will run: 4 high / 4 low")
    assert node_of(page, "Wan22Schedule", "node.graph !== app.rootGraph && node.graph.isRootGraph === false")
