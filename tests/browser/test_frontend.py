"""The pack in the real ComfyUI frontend: the shipped workflows load whole and queue, the canvas shows the
split live, old workflows load and run."""

import json
import os
import time

import pytest

from devtools.browser import FIT_GRAPH_JS
from devtools.paths import ROOT
from devtools.workflow_specs import WORKFLOWS

from .canvas import frontend_prompt, load, node_of, wait_for

EXAMPLES = os.path.join(ROOT, "example_workflows")
ARTIFACTS = os.path.join(ROOT, ".test-artifacts")


def shipped(name, api=False):
    with open(os.path.join(EXAMPLES, "api" if api else "", f"{name}.json")) as f:
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
        nodes: app.graph._nodes.map(n => [n.id, n.type]),
        links: Object.values(app.graph.links ?? {}).map(l => [l.id, l.origin_id, l.origin_slot, l.target_id, l.target_slot].map(Number)),
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
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Split")
    assert node_of(page, "Wan22Schedule", "node.wan22Preview").startswith("will run: 26 high / 14 low")
    for value, expected in ((5.0, "18 high / 22 low"), (12.0, "26 high / 14 low"), (5.0, "18 high / 22 low")):
        page.evaluate("""(value) => {
            const node = app.graph._nodes.find(n => n.type === 'Wan22Schedule');
            const widget = node.widgets.find(w => w.name === 'flow_shift');
            widget.setValue(value, { node, canvas: app.canvas });
        }""", value)
        wait_for(page, f"app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Preview?.includes('{expected}')")
    assert server.get("/queue") == {"queue_running": [], "queue_pending": []}
    assert server.get("/history") == history_before


def test_the_lightx2v_workflow_shows_its_two_and_two_split_through_the_native_loaders(page):
    """The schedule's experts come from Load Diffusion Model through LoraLoaderModelOnly and the MODEL bridge:
    the live split finds the files behind them."""
    load(page, shipped("wan22_t2v_a14b_lightx2v_4steps"))
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Split")
    assert node_of(page, "Wan22Schedule", "node.wan22Preview") == "will run: 2 high / 2 low (boundary 0.875, model default)"
    page.evaluate("""() => {  // unplug the low-noise expert: every step then runs on the high-noise one
        const bridge = app.graph._nodes.find(n => n.type === 'Wan22ExpertsFromModel');
        bridge.disconnectInput(bridge.findInputSlot('low_noise_model'));
    }""")
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Preview?.startsWith('will run: 4 high / 0 low')")


def test_a_reply_in_flight_never_overwrites_the_connect_a_loader_message(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Split")
    held = []
    page.route("**/wan22/split", lambda route: held.append(route))  # answered only when the test lets it
    try:
        page.evaluate("""() => {
            const node = app.graph._nodes.find(n => n.type === 'Wan22Schedule');
            node.widgets.find(w => w.name === 'steps').setValue(30, { node, canvas: app.canvas });
        }""")
        deadline = time.monotonic() + 300  # past the canvas's debounce, the request is on its way
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert len(held) == 1
        page.evaluate("""() => {
            const node = app.graph._nodes.find(n => n.type === 'Wan22Schedule');
            node.disconnectInput(node.findInputSlot('experts'));
        }""")
        wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Preview?.startsWith('connect')")
        with page.expect_response("**/wan22/split"):
            held[0].continue_()  # the reply to the request made while the loader was still connected
        page.wait_for_timeout(300)  # the page reads the reply
    finally:
        page.unroute("**/wan22/split")
    assert node_of(page, "Wan22Schedule", "node.wan22Preview") == "connect a Wan2.2 expert loader to see the split"


def test_boundary_ratio_is_shown_only_when_the_boundary_is_custom(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    hidden = "node.widgets.find(w => w.name === 'boundary_ratio').hidden"
    assert node_of(page, "Wan22Schedule", hidden) is True
    for mode, expect_hidden, split in (("custom", False, "(boundary 0.875, custom)"), ("auto", True, "model default")):
        page.evaluate("""(mode) => {
            const node = app.graph._nodes.find(n => n.type === 'Wan22Schedule');
            node.widgets.find(w => w.name === 'boundary').setValue(mode, { node, canvas: app.canvas });
        }""", mode)
        assert node_of(page, "Wan22Schedule", hidden) is expect_hidden
        wait_for(page, f"app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Preview?.includes('{split}')")


def test_the_frontend_refuses_our_experts_into_a_native_model_input(page):
    load(page, shipped("wan22_t2v_a14b_cachedit"))
    result = page.evaluate("""() => {
        const loader = app.graph._nodes.find(n => n.type === 'Wan22ExpertLoader');
        const ksampler = LiteGraph.createNode('KSampler');
        app.graph.add(ksampler);
        const before = Object.keys(app.graph.links ?? {}).length;
        const link = loader.connect(0, ksampler, ksampler.findInputSlot('model'));
        return { link: link ?? null, modelLink: ksampler.inputs.find(i => i.name === 'model').link ?? null,
                 added: Object.keys(app.graph.links ?? {}).length - before,
                 colour: LGraphCanvas.link_type_colors.WAN22_EXPERTS };
    }""")
    assert result["link"] is None and result["modelLink"] is None and result["added"] == 0
    assert result["colour"] == "#b06ad9"


def test_the_demo_queued_from_the_page_shows_the_split_and_the_savings(page, server):
    load(page, shipped("wan22_tiny_demo"))
    # A seed of its own, so that no earlier test's run of this graph is served from ComfyUI's cache.
    page.evaluate("""() => {
        const node = app.graph._nodes.find(n => n.type === 'Wan22TwoStageSampler');
        node.widgets.find(w => w.name === 'seed').setValue(20261130, { node, canvas: app.canvas });
    }""")
    page.get_by_role("button", name="Run", exact=True).first.click()  # as a person queues it
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22TwoStageSampler').wan22Report", timeout=600)
    sampler = node_of(page, "Wan22TwoStageSampler", "[node.wan22Result, node.wan22Report]")
    text, report = sampler
    assert text.startswith("14 high / 6 low steps (uni_pc/simple)")
    assert "cache high:" in text and "cache low:" in text and "% saved" in text
    assert report["split"] == {"high": 14, "low": 6} and report["cache"]["high"]["cached_steps"]
    assert node_of(page, "Wan22Schedule", "node.wan22Preview").startswith("will run: 14 high / 6 low")
    deadline = time.monotonic() + 120
    while server.get("/queue")["queue_running"] and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    page.evaluate(FIT_GRAPH_JS, [60, 90])  # past the side bar, the tabs and the queue panel
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "demo_run.png")
    page.screenshot(path=shot)
    assert os.path.getsize(shot) > 20_000
    print(f"screenshot of the finished demo run: {shot}")


SAVED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "saved")


@pytest.mark.parametrize("old,new", [("unipc", "uni_pc"), ("dpmpp", "dpmpp_2m")])
def test_a_workflow_saved_with_an_old_sampler_name_loads_and_runs(page, server, old, new):
    """The demo workflow as version 0.1.0 saved it: no scheduler widget yet, diffusers' sampler names."""
    with open(os.path.join(SAVED, "wan22_tiny_demo_0.1.0.json")) as f:
        workflow = json.load(f)
    schedule = next(n for n in workflow["nodes"] if n["type"] == "Wan22Schedule")
    schedule["widgets_values"][0] = old
    load(page, workflow)
    assert node_of(page, "Wan22Schedule", "Object.fromEntries(node.widgets.map(w => [w.name, w.value]))") == {
        "sampler": new, "steps": 20, "flow_shift": 12, "boundary": "auto", "boundary_ratio": 0.875,
        "scheduler": "simple"}
    wait_for(page, "app.graph._nodes.find(n => n.type === 'Wan22Schedule').wan22Split")
    page.evaluate(f"""() => {{  // a seed of its own, so that no earlier run of this graph is served from the cache
        const node = app.graph._nodes.find(n => n.type === 'Wan22TwoStageSampler');
        node.widgets.find(w => w.name === 'seed').setValue({7000 + len(old)}, {{ node, canvas: app.canvas }});
    }}""")
    status, body = server.queue(frontend_prompt(page))
    assert status == 200 and body.get("node_errors") == {}, body
    entry = server.wait(body["prompt_id"], timeout=1200)
    assert entry["status"]["status_str"] == "success", entry["status"]
    report = json.loads(entry["outputs"]["14"]["text"][0])
    assert (report["sampler"], report["scheduler"]) == (new, "simple")
