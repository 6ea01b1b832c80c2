"""The shipped workflows carry what the pack measured: every Cache-DiT node at the node's defaults (the error
criterion at the target the tuning bed chose), except the demo's, which says in its title that its target is for
random stand-ins. Read from the API-format copies (the browser tests hold them equal to the canvas files)."""

import json
import os

import pytest

from devtools.paths import ROOT
from devtools.workflow_specs import CACHE_DEFAULTS, DEMO_CACHE, DEMO_CACHE_TITLE, WORKFLOWS

API_DIR = os.path.join(ROOT, "example_workflows", "api")
# The MODEL node's inputs from the sampler node's: one expert's warm-up and cap, the rest shared.
SHARED = ("enabled", "residual_diff_threshold", "first_compute_blocks", "last_compute_blocks",
          "max_continuous_cached_steps", "calibrator", "criterion", "error_target")


def cache_nodes(name: str) -> list[dict]:
    with open(os.path.join(API_DIR, f"{name}.json"), encoding="utf-8") as f:
        api = json.load(f)
    return [v for v in api.values() if v["class_type"] in ("Wan22CacheDiT", "Wan22CacheDiTModel")]


def model_node_defaults(role: str) -> dict:
    return {**{k: CACHE_DEFAULTS[k] for k in SHARED}, "warmup_steps": CACHE_DEFAULTS[f"{role}_warmup_steps"],
            "max_cached_steps": CACHE_DEFAULTS[f"{role}_max_cached_steps"]}


@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_every_shipped_cache_node_carries_the_measured_defaults(name):
    nodes = cache_nodes(name)
    expected = DEMO_CACHE if name == "wan22_tiny_demo" else CACHE_DEFAULTS
    for node in nodes:
        inputs = {k: v for k, v in node["inputs"].items() if not isinstance(v, list)}  # links aside
        if node["class_type"] == "Wan22CacheDiT":
            assert inputs == expected, name
        else:
            role = "high" if "high" in node["_meta"]["title"] else "low"
            assert inputs == model_node_defaults(role), (name, node["_meta"]["title"])
    with open(os.path.join(ROOT, "example_workflows", f"{name}.json"), encoding="utf-8") as f:
        titles = [n.get("title") for n in json.load(f)["nodes"] if n["type"] == "Wan22CacheDiT"]
    assert (DEMO_CACHE_TITLE in titles) == (name == "wan22_tiny_demo")


def test_the_workflows_with_a_cache_are_the_ones_expected():
    """Six carry the sampler's Cache-DiT node, the template's graph two MODEL nodes; the LightX2V ones none."""
    with_cache = {name for name in WORKFLOWS if cache_nodes(name)}
    assert with_cache == set(WORKFLOWS) - {"wan22_t2v_a14b_lightx2v_4steps", "wan22_t2v_a14b_lightx2v_3stage"}
    assert DEMO_CACHE["error_target"] != CACHE_DEFAULTS["error_target"]
