"""The pack in the frontend's Vue-nodes mode, where nodes are DOM elements and nothing is drawn on the canvas
for them: the live split and what a run did show there too, in the pack's status widget."""

import json
import os

import pytest

from devtools.paths import ROOT
from devtools.workflow_specs import DEMO_TARGET

from .canvas import load, set_widget, shown, status_of, wait_for, wait_for_status

DEMO = os.path.join(ROOT, "example_workflows", "wan22_tiny_demo.json")
pytestmark = pytest.mark.parametrize("page", ["vue"], indirect=True)


def test_the_split_shows_on_the_vue_node_and_follows_its_widgets(page):
    with open(DEMO, encoding="utf-8") as f:
        load(page, json.load(f))
    wait_for_status(page, "Wan22Schedule", "will run: 14 high / 6 low")
    assert shown(page, "Wan22Schedule") == {"text": "will run: 14 high / 6 low (boundary 0.875, model default)",
                                            "inNode": True, "shown": True}
    set_widget(page, "Wan22Schedule", "flow_shift", 5.0)
    wait_for_status(page, "Wan22Schedule", "will run: 9 high / 11 low")


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
    # the demo's own target (random stand-ins), and the CFG passes really run
    assert f"last run: high DBCache_F1B0_W1I1M0MC3_E{DEMO_TARGET:g}_CFG0" in cache["text"]
    assert status_of(page, "Wan22Schedule").startswith("will run: 14 high / 6 low")
