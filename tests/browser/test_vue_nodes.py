"""The pack in the frontend's Vue-nodes mode, where nodes are DOM elements and nothing is drawn on the canvas
for them: the live split and what a run did show there too, in the pack's status widget."""

import json
import os

import pytest

from devtools.browser import browser, open_comfyui
from devtools.paths import ROOT

from .canvas import (HOSTILE_MODEL, HOSTILE_SCHEDULER, hostile_names_show_as_text, load, node_of, set_widget, status_of,
                     wait_for, wait_for_status)

DEMO = os.path.join(ROOT, "example_workflows", "wan22_tiny_demo.json")
# The status widget's element as the user sees it: inside the node's own element, laid out, not hidden.
SHOWN = """
const element = node.widgets.find(w => w.name === 'wan22_status').element;
const box = element.getBoundingClientRect();
const host = document.querySelector(`[data-node-id="${node.id}"]`);
return { text: element.textContent, inNode: !!host && host.contains(element),
         shown: element.offsetParent !== null && box.width > 0 && box.height > 0 };
"""


@pytest.fixture(scope="module")
def page(server):
    with browser() as instance:
        page = open_comfyui(instance, server.url, settings={"Comfy.VueNodes.Enabled": True})
        assert page.evaluate("() => document.querySelectorAll('[data-node-id]').length") > 0  # Vue nodes on screen
        yield page
    server.post("/settings/Comfy.VueNodes.Enabled", False)


def shown(page, node_type):
    return node_of(page, node_type, f"(() => {{ {SHOWN} }})()")


def test_the_split_shows_on_the_vue_node_and_follows_its_widgets(page):
    with open(DEMO, encoding="utf-8") as f:
        load(page, json.load(f))
    wait_for_status(page, "Wan22Schedule", "will run: 14 high / 6 low")
    assert shown(page, "Wan22Schedule") == {"text": "will run: 14 high / 6 low (boundary 0.875, model default)",
                                            "inNode": True, "shown": True}
    set_widget(page, "Wan22Schedule", "flow_shift", 5.0)
    wait_for_status(page, "Wan22Schedule", "will run: 9 high / 11 low")


def test_markup_in_a_model_name_and_a_scheduler_name_shows_as_text_on_the_vue_node(page):
    with open(DEMO, encoding="utf-8") as f:
        model, scheduler = hostile_names_show_as_text(page, json.load(f))
    assert model["text"].startswith(f"split: high_noise_model: {HOSTILE_MODEL!r} is not in models/diffusion_models")
    assert scheduler["text"].startswith(f"split: scheduler: unknown scheduler {HOSTILE_SCHEDULER!r}: use one of")
    for text in (model, scheduler):
        assert (text["children"], text["markup"], text["injected"]) == (0, 0, None)
    assert shown(page, "Wan22Schedule")["inNode"] and shown(page, "Wan22Schedule")["shown"]


def test_a_run_shows_its_split_and_the_cache_summary_on_the_vue_nodes(page, server, frontend):
    with open(DEMO, encoding="utf-8") as f:
        load(page, json.load(f))
    set_widget(page, "Wan22TwoStageSampler", "seed", 31337 + (frontend == "newest"))  # not served from the cache
    wait_for_status(page, "Wan22Schedule", "will run: 14 high / 6 low")
    page.get_by_role("button", name="Run", exact=True).first.click()
    wait_for(page, "find('Wan22TwoStageSampler').wan22Report", timeout=600)
    sampler = shown(page, "Wan22TwoStageSampler")
    assert sampler["inNode"] and sampler["shown"]
    assert sampler["text"].startswith("14 high / 6 low steps (uni_pc/simple)") and "% saved" in sampler["text"]
    cache = shown(page, "Wan22CacheDiT")
    assert cache["inNode"] and cache["shown"]
    assert "last run: high DBCache_F1B0_W4I1M0MC3_R0.24_CFG0" in cache["text"]  # the CFG passes really run
    assert status_of(page, "Wan22Schedule").startswith("will run: 14 high / 6 low")
