"""The quality figures the README and docs/ give, checked against the committed results they come from
(bench/results/quality_<bed>.json, through bench.quality.report.figures): a figure changed in a page, or results
committed without the pages that quote them, fails here."""

import json
import os
import re

import pytest

from bench.quality.report import figures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# page -> bed -> the passages that quote its figures, with each figure as {its name in figures()}
QUOTED = {
    "README.md": {"tuning": [
        "on the tuning bed its median error is {ours_error / target} times its target at 20 and 40 steps",
        "| error criterion | {ours_error 20 / target} ({ours_error 20 in band} targets within 0.67 to 1.5 of both) | "
        "{ours_error 20 / estimate} | {ours_error 40 / target} ({ours_error 40 in band}) | "
        "{ours_error 40 / estimate} |",
        "| with TaylorSeer | {ours_taylorseer 20 / target} ({ours_taylorseer 20 in band}) | "
        "{ours_taylorseer 20 / estimate} | {ours_taylorseer 40 / target} ({ours_taylorseer 40 in band}) | "
        "{ours_taylorseer 40 / estimate} |",
        "cost **{defaults 20}** at 20 steps and **{defaults 40}** at 40",
        "the budgets 0.03 and 0.05 measured {budget 0.03 20} and {budget 0.05 20} at 20 steps, {budget 0.03 40} and "
        "{budget 0.05 40} at 40, for {budget work} runs of work",
    ], "deep": [
        "on `deep` {ours_error / target} times;",
        "measured {ours_error / target} times the target at 20 and 40 steps, {ours_error 20 / estimate} times its "
        "estimate at 20 steps and {ours_error 40 / estimate} at 40",
    ], "follow": [
        "at 20 steps `follow` measured {ours_error 20 / target} and `crowd`",
    ], "crowd": [
        "and `crowd` {ours_error 20 / target} times the target",
    ]},
    "docs/quality.md": {"tuning": [
        "| `tuning` | **tuning** | {bed layers} | blob and gabor, 4 motions | {bed sizes} | {bed training} | "
        "{bed losses} | {bed fit} | {bed class right} | {bed sha} |",
        "| 20 (uni_pc, shift 8) | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} "
        "targets | {ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| 40 (euler, shift 5) | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "The defaults (target 0.02, chosen by `choose` on these results) cost {defaults 20} at 20 steps and "
        "{defaults 40} at 40 (median relative L2 / block cost)",
    ], "deep": [
        "| `deep` | **tuning** (held out until issue 54) | {bed layers} | ring and square, 4 motions, texture 0.6 | "
        "{bed sizes} | {bed training} | {bed losses} | {bed fit} | {bed class right} | {bed sha} |",
        "| 20 (uni_pc, shift 8) | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} "
        "targets | {ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| 40 (euler, shift 5) | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "The defaults cost {defaults 20} at 20 steps (the block-cost bound 0.85 missed by one cached step) and "
        "{defaults 40} at 40. The budgets hold at 20 and 40 steps (0.03: {budget 0.03 20} and {budget 0.03 40}; 0.05: "
        "{budget 0.05 20} and {budget 0.05 40}; {budget work} runs of work)",
    ], "wide": [
        "| `wide` | **tuning** (held out until issue 54) | {bed layers} | blob and ring, 4 motions, texture 0.6, "
        "camera pans | {bed sizes} | {bed training} | {bed losses} | {bed fit} | {bed class right} | {bed sha} |",
    ], "follow": [
        "| `follow`, 20 | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} targets | "
        "{ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| `follow`, 40 | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "| `follow` | **held-out** | {bed layers} | cross and bar, 4 motions, a colour and a place a class | "
        "{bed sizes} | {bed training} | {bed losses} | {bed fit} | {bed class right} | {bed sha} |",
        "The defaults cost {defaults 20} and {defaults 40} on `follow`",
    ], "crowd": [
        "| `crowd`, 20 | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} | "
        "{ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| `crowd`, 40 | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "| `crowd` | **held-out** | {bed layers} | dot and cross, 4 motions, two objects, half speed, texture 0.8 "
        "(coarser), camera pans | {bed sizes} | {bed training} | {bed losses} | {bed fit} | {bed class right} | "
        "{bed sha} |",
        "{defaults 20} and {defaults 40} on `crowd`",
    ]},
    "web/docs/Wan22CacheDiT.md": {"tuning": [
        "the measured median error was {ours_error / target} times the target",
    ]},
}


def results(bed: str) -> dict:
    with open(os.path.join(ROOT, "bench", "results", f"quality_{bed}.json"), encoding="utf-8") as f:
        return json.load(f)


def one_line(text: str) -> str:
    return " ".join(text.split())


def filled(passage: str, figures_of: dict) -> str:
    """The passage with each {figure name} replaced by the figure (names hold dots: not str.format's)."""
    return one_line(re.sub(r"\{([^{}]+)\}", lambda m: figures_of[m.group(1)], passage))


@pytest.mark.parametrize("page", list(QUOTED))
def test_each_quoted_figure_is_the_committed_results(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = one_line(f.read())
    for bed, passages in QUOTED[page].items():
        figures_of = figures(results(bed))
        for passage in passages:
            expected = filled(passage, figures_of)
            assert expected in text, f"{page} should say, from bench/results/quality_{bed}.json: {expected}"


def test_a_figure_changed_in_a_page_or_in_the_results_is_seen():
    tuning = results("tuning")
    quoted = figures(tuning)
    passage = filled(QUOTED["README.md"]["tuning"][3], quoted)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = one_line(f.read())
    assert passage in readme
    assert passage.replace(quoted["defaults 20"], "0.0001 / 0.825") not in readme
    defaults = next(p for r in tuning["step_counts"] if r["steps"] == 20 for p in r["points"]
                    if p["method"] == "defaults")
    defaults["rel_l2"]["median"] += 0.001
    assert figures(tuning)["defaults 20"] != quoted["defaults 20"]
