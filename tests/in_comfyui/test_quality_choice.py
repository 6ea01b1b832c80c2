"""The tuning bed is the only input of what chooses the pack's defaults: bench.quality's choice, read from the
committed tuning results (bench/results/quality_tuning.json), is what the pack ships, and another bed's results
are refused as an input."""

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
def test_only_the_tuning_bed_chooses(bed):
    from bench.quality import choose

    with pytest.raises(ValueError, match=f"bed '{bed}' is not `tuning`: only the tuning bed chooses"):
        choose(results(bed))
