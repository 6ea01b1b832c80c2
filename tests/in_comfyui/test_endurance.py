"""The endurance run at a smaller size, through a real server (the full one: bench/endurance.py)."""

import os

import pytest

from bench.endurance import run_endurance
from devtools.comfy_server import ComfyServer
from devtools.standins import write_standins


@pytest.fixture(scope="module")
def classic_cache_server(tmp_path_factory):
    """ComfyUI's classic cache holds only the current graph's outputs: RSS growth is then a leak."""
    base = tmp_path_factory.mktemp("endurance_base")
    write_standins(os.path.join(base, "models"), os.path.join(base, "input"))
    with ComfyServer(str(base), extra_args=("--cache-classic",)) as running:
        yield running


def test_a_mixed_queue_with_interrupts_and_invalid_prompts_stays_correct_and_flat(classic_cache_server):
    results = run_endurance(classic_cache_server, total=16, interrupts=1, invalid=3, log=lambda *_: None)
    assert results["valid_ok"] == results["valid"] == 12, results["failures"]
    assert results["split_mismatches"] == []
    assert results["interrupted"] == 1
    assert results["invalid_clear"] == results["invalid"] == 3
    assert results["rss_growth"] < 0.05, results["rss_mb"]
    assert results["first_prompt_repeats"]
