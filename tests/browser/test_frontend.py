"""The pack in the real ComfyUI frontend's classic canvas: the shipped workflows load whole and queue, the canvas
shows the split live, old workflows load with their values in place and run."""

import json
import os

import pytest

from devtools.browser import FIT_GRAPH_JS
from devtools.paths import ROOT
from devtools.workflow_specs import CACHE_DEFAULTS, WORKFLOWS

from .canvas import (frontend_prompt, load, node_of, replies_handled, set_widget, status_of, wait_for, wait_for_status,
                     wait_until)

EXAMPLES = os.path.join(ROOT, "example_workflows")
ARTIFACTS = os.path.join(ROOT, ".test-artifacts")
SAVED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "saved")


def shipped(name, api=False):
    with open(os.path.join(EXAMPLES, "api" if api else "", f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def saved(name):
    with open(os.path.join(SAVED, name), encoding="utf-8") as f:
        return json.load(f)


def test_the_template_listing_shows_the_workflows_with_thumbnails(server):
    listing = server.get("/api/workflow_templates")
    assert sorted(listing["wan22-cachedit"]) == sorted(WORKFLOWS)
    for name in WORKFLOWS:
        with __import__("urllib.request").request.urlopen(
                f"{server.url}/api/workflow_templates/wan22-cachedit/{name}.jpg") as r:
            assert r.status == 200 and r.headers["Content-Type"] == "image/jpeg" and len(r.read()) > 5000


@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_each_shipped_workflow_loads_whole_and_the_frontends_prompt_passes_validation(page, server, name):
    workflow = shipped(name)
    load(page, workflow)
    state = page.evaluate("""() => ({
        registered: Object.keys(LiteGraph.registered_node_types),
        nodes: app.graph.nodes.map(n => [n.id, n.type]),
        links: [...app.graph.links.values()].map(l => [l.id, l.origin_id, l.origin_slot, l.target_id, l.target_slot]
                                                       .map(Number)),
    })""")
    types = {n["type"] for n in workflow["nodes"]}
    assert types <= set(state["registered"]), types - set(state["registered"])  # no missing node types
    assert sorted(n["id"] for n in workflow["nodes"]) == sorted(int(i) for i, _ in state["nodes"])
    expected_links = sorted([l[0], l[1], l[2], l[3], l[4]] for l in workflow["links"])
    assert sorted(state["links"]) == expected_links  # every link arrived, none broken
    for model in workflow["models"]:
        assert model["url"].startswith("https://") and model["url"].endswith(model["name"])

    prompt = frontend_prompt(page)
    api_copy = shipped(name, api=True)
    assert {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()} == \
        {k: (v["class_type"], v["inputs"]) for k, v in api_copy.items()}  # the API copy is current
    status, body = server.queue(prompt)
    assert status == 200 and body.get("node_errors") == {}, body
    server.wait(body["prompt_id"], timeout=1200)  # let it end before the next test uses the queue


def test_changing_flow_shift_updates_the_split_without_queueing(page, server):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    history_before = server.get("/history")
    assert wait_for_status(page, "Wan22Schedule", "will run:").startswith("will run: 26 high / 14 low")
    for value, expected in ((5.0, "18 high / 22 low"), (12.0, "26 high / 14 low"), (5.0, "18 high / 22 low")):
        set_widget(page, "Wan22Schedule", "flow_shift", value)
        wait_for_status(page, "Wan22Schedule", expected)
    assert server.get("/queue") == {"queue_running": [], "queue_pending": []}
    assert server.get("/history") == history_before


def test_the_lightx2v_workflow_shows_its_two_and_two_split_through_the_native_loaders(page):
    """The schedule's experts come from Load Diffusion Model through LoraLoaderModelOnly and the MODEL bridge:
    the server reads the files behind them out of the frontend's own prompt."""
    load(page, shipped("wan22_t2v_a14b_lightx2v_4steps"))
    assert wait_for_status(page, "Wan22Schedule", "will run:") == \
        "will run: 2 high / 2 low (boundary 0.875, model default)"
    page.evaluate("""() => {  // unplug the low-noise expert: every step then runs on the high-noise one
        const bridge = app.graph.nodes.find(n => n.type === 'Wan22ExpertsFromModel');
        bridge.disconnectInput(bridge.findInputSlot('low_noise_model'));
    }""")
    wait_for_status(page, "Wan22Schedule", "will run: 4 high / 0 low")


def test_a_reply_in_flight_never_overwrites_a_newer_one(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    wait_for_status(page, "Wan22Schedule", "will run: 26 high / 14 low")
    held = []
    page.route("**/wan22/split", lambda route: held.append(route))  # answered only when the test lets it

    def requests_held(n):  # each past the canvas's debounce, on its way
        wait_until(page, lambda: len(held) >= n)

    try:
        set_widget(page, "Wan22Schedule", "steps", 30)
        requests_held(1)
        set_widget(page, "Wan22Schedule", "steps", 10)
        requests_held(2)
        before = replies_handled(page)
        held[1].continue_()  # the newer question's answer arrives first ...
        wait_for_status(page, "Wan22Schedule", "will run: 7 high / 3 low")
        held[0].continue_()  # ... then the stale one, for 30 steps
        wait_for(page, f"window.wan22Canvas.handled >= {before + 2}")  # the page has read it too
    finally:
        page.unroute("**/wan22/split")
    assert len(held) == 2 and status_of(page, "Wan22Schedule").startswith("will run: 7 high / 3 low")


def test_the_boundary_ratio_is_an_input_of_the_custom_boundary_only(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    ratio = "node.widgets.some(w => w.name === 'boundary.boundary_ratio')"
    assert node_of(page, "Wan22Schedule", ratio) is False
    for mode, shown, split in (("custom", True, "(boundary 0.875, custom)"), ("auto", False, "model default")):
        set_widget(page, "Wan22Schedule", "boundary", mode)
        assert node_of(page, "Wan22Schedule", ratio) is shown
        wait_for_status(page, "Wan22Schedule", split)
    set_widget(page, "Wan22Schedule", "boundary", "custom")
    set_widget(page, "Wan22Schedule", "boundary.boundary_ratio", 0.95)
    wait_for_status(page, "Wan22Schedule", "will run: 16 high / 24 low (boundary 0.95, custom)")
    inputs = frontend_prompt(page)["5"]["inputs"]
    assert (inputs["boundary"], inputs["boundary.boundary_ratio"]) == ("custom", 0.95)


def widget_values(page, node_type="Wan22Schedule"):
    return node_of(page, node_type, "Object.fromEntries(node.widgets.filter(w => w.serialize !== false)"
                                    ".map(w => [w.name, w.value]))")


@pytest.mark.parametrize("boundary,values", [
    ("auto", {"boundary": "auto", "scheduler": "simple"}),
    ("custom", {"boundary": "custom", "boundary.boundary_ratio": 0.9, "scheduler": "beta"}),
])
def test_a_workflow_saved_by_version_0_2_0_loads_with_its_values_in_place(page, server, boundary, values):
    """0.2.0 saved boundary_ratio after boundary whatever the mode; now it is there for custom only."""
    workflow = saved("wan22_tiny_demo_0.2.0.json")
    schedule = next(n for n in workflow["nodes"] if n["type"] == "Wan22Schedule")
    assert schedule["widgets_values"] == ["uni_pc", 20, 12, "auto", 0.875, "simple"]
    if boundary == "custom":
        schedule["widgets_values"] = ["uni_pc", 20, 12, "custom", 0.9, "beta"]
    load(page, workflow)
    assert widget_values(page) == {"sampler": "uni_pc", "steps": 20, "flow_shift": 12, **values}
    wait_for_status(page, "Wan22Schedule", "will run:")
    prompt = frontend_prompt(page)
    if boundary == "auto":  # the same prompt as the demo the pack ships now
        assert prompt["5"]["inputs"] == shipped("wan22_tiny_demo", api=True)["5"]["inputs"]
    status, body = server.queue(prompt)
    assert status == 200 and body.get("node_errors") == {}, body
    server.wait(body["prompt_id"], timeout=1200)


def test_a_workflow_shipped_by_0_7_0_keeps_its_threshold_cache_where_the_shipped_ones_now_carry_the_defaults(page):
    """0.7.0 shipped its Cache-DiT nodes with the threshold criterion at 0.24 (warm-ups 4 and 2); a workflow saved
    so keeps those values, in the canvas and in the prompt it queues, while the files shipped now carry the node's
    measured defaults."""
    old = {"enabled": True, "residual_diff_threshold": 0.24, "first_compute_blocks": 1, "last_compute_blocks": 0,
           "max_continuous_cached_steps": 3, "high_warmup_steps": 4, "high_max_cached_steps": -1,
           "low_warmup_steps": 2, "low_max_cached_steps": 20, "calibrator": "none", "criterion": "threshold",
           "error_target": 0.0125}
    load(page, saved("wan22_t2v_a14b_cachedit_0.7.0.json"))
    assert widget_values(page, "Wan22CacheDiT") == old
    cache = next(v for v in frontend_prompt(page).values() if v["class_type"] == "Wan22CacheDiT")["inputs"]
    assert {k: v for k, v in cache.items() if k != "experts"} == old
    now = next(v for v in shipped("wan22_t2v_a14b_cachedit", api=True).values()
               if v["class_type"] == "Wan22CacheDiT")["inputs"]
    assert {k: v for k, v in now.items() if k != "experts"} == CACHE_DEFAULTS


def test_a_saved_custom_boundary_keeps_every_value_when_the_workflow_is_opened_again(page):
    """The newest frontend hands a node only as many saved values as it has widgets before its dynamic inputs
    expand; the schedule node takes the rest back from the workflow."""
    load(page, shipped("wan22_tiny_demo"))
    for name, value in (("boundary", "custom"), ("boundary.boundary_ratio", 0.8), ("scheduler", "beta")):
        set_widget(page, "Wan22Schedule", name, value)
    workflow = json.loads(page.evaluate("() => JSON.stringify(app.graph.serialize())"))  # as a save writes it
    load(page, {"nodes": [], "links": [], "version": 0.4})
    load(page, workflow)
    assert widget_values(page) == {"sampler": "uni_pc", "steps": 20, "flow_shift": 12, "boundary": "custom",
                                   "boundary.boundary_ratio": 0.8, "scheduler": "beta"}


def test_the_frontend_refuses_our_experts_into_a_native_model_input(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    result = page.evaluate("""() => {
        const loader = app.graph.nodes.find(n => n.type === 'Wan22ExpertLoader');
        const ksampler = LiteGraph.createNode('KSampler');
        app.graph.add(ksampler);
        const before = app.graph.links.size;
        const link = loader.connect(0, ksampler, ksampler.findInputSlot('model'));
        return { link: link ?? null, modelLink: ksampler.inputs.find(i => i.name === 'model').link ?? null,
                 added: app.graph.links.size - before, colour: LGraphCanvas.link_type_colors.WAN22_EXPERTS };
    }""")
    assert result["link"] is None and result["modelLink"] is None and result["added"] == 0
    assert result["colour"] == "#b06ad9"


def test_the_demo_queued_from_the_page_shows_the_split_and_the_savings(page, server, frontend):
    load(page, shipped("wan22_tiny_demo"))
    # A seed of its own, so that no earlier test's run of this graph is served from ComfyUI's cache.
    set_widget(page, "Wan22TwoStageSampler", "seed", 20261130 + (frontend == "newest"))
    page.get_by_role("button", name="Run", exact=True).first.click()  # as a person queues it
    wait_for(page, "find('Wan22TwoStageSampler').wan22Report", timeout=600)
    text, report = node_of(page, "Wan22TwoStageSampler",
                           "[node.widgets.find(w => w.name === 'wan22_status').element.textContent, node.wan22Report]")
    assert text.startswith("14 high / 6 low steps (uni_pc/simple)")
    assert "cache high:" in text and "cache low:" in text and "% saved" in text
    assert report["split"] == {"high": 14, "low": 6} and report["cache"]["high"]["cached_steps"]
    assert status_of(page, "Wan22Schedule").startswith("will run: 14 high / 6 low")
    used = status_of(page, "Wan22CacheDiT")  # the CFG passes each stage really ran with
    assert f"last run: high {report['cache']['high']['config']} (positive + negative in one call)" in used
    assert report["cache"]["high"]["config"].endswith("_CFG0")
    wait_until(page, lambda: not server.get("/queue")["queue_running"])
    page.evaluate(FIT_GRAPH_JS, [60, 90])  # past the side bar, the tabs and the queue panel
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, f"demo_run_{frontend}.png")
    page.screenshot(path=shot)
    assert os.path.getsize(shot) > 20_000
    print(f"screenshot of the finished demo run: {shot}")


@pytest.mark.parametrize("old,new", [("unipc", "uni_pc"), ("dpmpp", "dpmpp_2m")])
def test_a_workflow_saved_with_an_old_sampler_name_loads_and_runs(page, server, frontend, old, new):
    """The demo workflow as version 0.1.0 saved it: no scheduler widget yet, diffusers' sampler names (the
    canvas learns them from the server)."""
    workflow = saved("wan22_tiny_demo_0.1.0.json")
    schedule = next(n for n in workflow["nodes"] if n["type"] == "Wan22Schedule")
    schedule["widgets_values"][0] = old
    load(page, workflow)
    assert widget_values(page) == {"sampler": new, "steps": 20, "flow_shift": 12, "boundary": "auto",
                                   "scheduler": "simple"}
    wait_for_status(page, "Wan22Schedule", "will run:")
    # a seed of its own, so that no earlier run of this graph is served from the cache
    set_widget(page, "Wan22TwoStageSampler", "seed", 7000 + len(old) + 10 * (frontend == "newest"))
    status, body = server.queue(frontend_prompt(page))
    assert status == 200 and body.get("node_errors") == {}, body
    entry = server.wait(body["prompt_id"], timeout=1200)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = json.loads(entry["outputs"]["14"]["text"][0])
    assert (report["sampler"], report["scheduler"]) == (new, "simple")


@pytest.mark.slow  # about 3 minutes on two cores (a run encoded by the full-size umt5 stand-in)
def test_the_three_stage_workflow_shows_the_three_parts_it_runs(page, native_text_server, frontend):
    """The lead stage node shows the lead, high and low steps live, from the frontend's own prompt; the run
    of that prompt (at a tiny size) reports the same three."""
    load(page, shipped("wan22_t2v_a14b_lightx2v_3stage"))
    shown = wait_for_status(page, "Wan22LeadStage", "will run:")
    assert shown.startswith("will run: 3 lead (of 24) / 3 high / 4 low (boundary 0.875, model default)")
    assert "main from step 1; hand-off exact" in shown
    set_widget(page, "Wan22LeadStage", "lead_steps", 12)  # 12-step sigmas miss the main start: an own last step
    shown_12 = wait_for_status(page, "Wan22LeadStage", "of 12)")
    assert "hand-off by a last lead step of its own" in shown_12
    set_widget(page, "Wan22LeadStage", "lead_steps", 24)
    wait_for_status(page, "Wan22LeadStage", "3 lead (of 24)")
    for name, value in (("width", 64), ("height", 64), ("length", 5)):
        set_widget(page, "EmptyHunyuanLatentVideo", name, value)
    # A seed of its own per frontend, so that its run is not served from ComfyUI's cache of the other's.
    set_widget(page, "Wan22TwoStageSampler", "seed", 20261201 + (frontend == "newest"))
    prompt = frontend_prompt(page)
    status, body = native_text_server.queue(prompt)
    assert status == 200 and body["node_errors"] == {}, body
    entry = native_text_server.wait(body["prompt_id"], timeout=1200)
    assert entry["status"]["status_str"] == "success", entry["status"]
    sampler = next(k for k, v in prompt.items() if v["class_type"] == "Wan22TwoStageSampler")
    report = entry["outputs"][sampler]["report"][0]
    split = report["split"]
    assert shown.startswith(f"will run: {split['lead']} lead (of {report['lead']['steps']}) / {split['high']} high / "
                            f"{split['low']} low")


def model_cache_graph(seed: int) -> dict:
    """A graph of ComfyUI's own samplers, as the template wires them: each expert's Load Diffusion Model ->
    Wan2.2 Cache-DiT (MODEL) -> ModelSamplingSD3 -> KSamplerAdvanced (8 steps, switch at 4)."""
    from devtools.standins import TEXT_FOLDER
    from devtools.workflow_specs import node

    sampler = {"noise_seed": seed, "control_after_generate": "fixed", "steps": 8, "cfg": 1.0, "sampler_name": "euler",
               "scheduler": "simple"}
    cache = {"residual_diff_threshold": 0.8, "warmup_steps": 1, "max_cached_steps": -1}
    return {"nodes": [
        node(1, "UNETLoader", [20, 40], {"unet_name": "wan2.2_t2v_high_noise_14B_fp16.safetensors"}),
        node(2, "UNETLoader", [20, 300], {"unet_name": "wan2.2_t2v_low_noise_14B_fp16.safetensors"}),
        node(3, "Wan22TextEncode", [20, 560], {"model_folder": TEXT_FOLDER, "prompt": "a red cat in the rain",
                                               "negative_prompt": "blurry"}),
        node(4, "EmptyHunyuanLatentVideo", [20, 900], {"width": 32, "height": 32, "length": 1, "batch_size": 1}),
        node(5, "Wan22CacheDiTModel", [440, 40], cache, {"model": (1, 0)}, "Cache-DiT high"),
        node(6, "Wan22CacheDiTModel", [440, 400], cache, {"model": (2, 0)}, "Cache-DiT low"),
        node(7, "ModelSamplingSD3", [880, 40], {"shift": 5.0}, {"model": (5, 0)}),
        node(8, "ModelSamplingSD3", [880, 400], {"shift": 5.0}, {"model": (6, 0)}),
        node(9, "KSamplerAdvanced", [1320, 40], {**sampler, "add_noise": "enable", "start_at_step": 0,
                                                 "end_at_step": 4, "return_with_leftover_noise": "enable"},
             {"model": (7, 0), "positive": (3, 0), "negative": (3, 1), "latent_image": (4, 0)}),
        node(10, "KSamplerAdvanced", [1760, 40], {**sampler, "add_noise": "disable", "start_at_step": 4,
                                                  "end_at_step": 10000, "return_with_leftover_noise": "disable"},
             {"model": (8, 0), "positive": (3, 0), "negative": (3, 1), "latent_image": (9, 0)}),
        node(11, "SaveLatent", [2200, 40], {"filename_prefix": "wan22_model_cache"}, {"samples": (10, 0)}),
    ]}


def test_the_cache_dit_model_node_shows_what_each_sample_call_cached_on_the_canvas(page, frontend):
    """The MODEL node runs before its samplers: each KSamplerAdvanced's call tells the canvas what the cache
    did over that call's 4 evaluations."""
    from devtools.build_workflows import BUILD_JS

    page.evaluate(BUILD_JS, model_cache_graph(20261201 + (frontend == "newest")))
    page.get_by_role("button", name="Run", exact=True).first.click()
    for title in ("Cache-DiT high", "Cache-DiT low"):
        text = wait_for(page, f"(n => n?.widgets.find(w => w.name === 'wan22_status').element.textContent"
                              f".includes('last sample call') && n.widgets.find(w => w.name === 'wan22_status')"
                              f".element.textContent)(app.graph.nodes.find(n => n.title === {json.dumps(title)}))",
                        timeout=600)
        assert "last sample call: " in text and "of 4 evaluations cached (DBCache_" in text and "% saved" in text, text


def test_the_extensions_test_counters_are_not_in_a_users_page(page, server):
    """window.wan22Canvas (what the tests wait on) exists only on a page the tests open with their flag."""
    from devtools.browser import READY

    plain = page.context.browser.new_page()
    try:
        plain.goto(server.url)
        plain.wait_for_function(READY, timeout=120_000)
        assert plain.evaluate("() => typeof window.wan22Canvas") == "undefined"
        assert page.evaluate("() => typeof window.wan22Canvas") == "object"
    finally:
        plain.close()


def test_a_parallel_plan_saved_before_the_split_input_keeps_ulysses_and_a_new_one_takes_auto(page):
    """A workflow saved with the plan node's four values of before the split input runs as it ran (ulysses),
    while a plan node added now starts at auto."""
    workflow = shipped("wan22_t2v_a14b_parallel")
    plan = next(n for n in workflow["nodes"] if n["type"] == "Wan22ParallelPlan")
    assert plan["widgets_values"] == [2, "auto", 2, 0, "auto"]  # as shipped now
    plan["widgets_values"] = plan["widgets_values"][:4]  # as saved before the split input
    load(page, workflow)
    assert widget_values(page, "Wan22ParallelPlan")["split"] == "ulysses"
    assert frontend_prompt(page)["15"]["inputs"]["split"] == "ulysses"
    added = page.evaluate("""() => {
        const node = LiteGraph.createNode("Wan22ParallelPlan");
        return node.widgets.find((w) => w.name === "split").value;
    }""")
    assert added == "auto"
