"""The tuning bed is the only input of what chooses the pack's defaults: bench.quality's choice, read from the
committed tuning results (bench/results/quality_tuning.json), is what the pack ships, and a held-out bed's
results are refused as an input."""

import json
import os

import pytest

from devtools.paths import ROOT

RESULTS = os.path.join(ROOT, "bench", "results")


def results(bed: str) -> dict:
    with open(os.path.join(RESULTS, f"quality_{bed}.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_pack_ships_what_the_tuning_bed_chose():
    from bench.quality import choose, pack_constants

    tuning = results("tuning")
    assert tuning["bed"]["role"] == "tuning"
    chosen = choose(tuning)
    assert chosen == tuning["choice"]  # the committed choice is what these results give
    assert {k: chosen[k] for k in pack_constants()} == pack_constants()


@pytest.mark.parametrize("bed", ["deep", "wide"])
def test_a_held_out_bed_chooses_nothing(bed):
    from bench.quality import choose

    held_out = results(bed)
    assert held_out["bed"]["role"] == "held-out"
    with pytest.raises(ValueError, match="held out"):
        choose(held_out)
