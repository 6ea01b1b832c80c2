"""What the pack shows alike in both canvas modes of the frontend: each test runs on a page in the classic
litegraph canvas and on one in the Vue-nodes mode."""

import json
import os

import pytest

from devtools.paths import ROOT

from .canvas import CANVAS_MODES, HOSTILE_MODEL, HOSTILE_SCHEDULER, hostile_names_show_as_text, shown

DEMO = os.path.join(ROOT, "example_workflows", "wan22_tiny_demo.json")
pytestmark = pytest.mark.parametrize("page", list(CANVAS_MODES), indirect=True)


def test_markup_in_a_model_name_and_a_scheduler_name_shows_as_text(page):
    """The route's refusals carry the names back; the canvas inserts them as text, never as HTML (on a Vue
    node, in the node's own element)."""
    with open(DEMO, encoding="utf-8") as f:
        model, scheduler = hostile_names_show_as_text(page, json.load(f))
    assert model["text"].startswith(f"split: high_noise_model: {HOSTILE_MODEL!r} is not in models/diffusion_models")
    assert model["text"].endswith("[on node 4, Wan22ExpertLoader]")
    assert scheduler["text"].startswith(f"split: scheduler: unknown scheduler {HOSTILE_SCHEDULER!r}: use one of")
    for text in (model, scheduler):
        assert (text["children"], text["markup"], text["injected"]) == (0, 0, None)
    if page.canvas_mode == "vue":
        status = shown(page, "Wan22Schedule")
        assert status["inNode"] and status["shown"]
