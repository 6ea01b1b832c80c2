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
        "at 20 steps `follow` measured {ours_error 20 / target}, `crowd`",
    ], "crowd": [
        "`crowd` {ours_error 20 / target} and `path`",
    ], "path": [
        "and `path` {ours_error 20 / target} times the target",
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
        "{frontier 20} and {frontier 40} on `tuning`",
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
        "{frontier 20} and {frontier 40} on `deep`",
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
        "the best points of ours run {frontier 20} and {frontier 40} of the blocks on `follow` (20 and 40 steps)",
        "(`follow` {budget 0.03 20} against {budget 0.05 20},",
        "its calibration found a target ({budget 0.0005 40 target}) that cached a little and measured "
        "{budget 0.0005 40}, over the budget",
    ], "crowd": [
        "| `crowd`, 20 | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} | "
        "{ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| `crowd`, 40 | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "| `crowd` | **held-out** | {bed layers} | dot and cross, 4 motions, two objects, half speed, texture 0.8 "
        "(coarser), camera pans | {bed sizes} | {bed training} | {bed losses} | {bed fit} | {bed class right} | "
        "{bed sha} |",
        "{defaults 20} and {defaults 40} on `crowd`",
        "{frontier 20} and {frontier 40} on `crowd`",
        "on `crowd` at 20 steps no point of ours has no more error and block cost than {peers unmatched 20}.",
        "`crowd` the 0.05 at 20 steps ({budget 0.05 20}) took {budget 0.05 20 work} runs of work",
        "`crowd` {budget 0.03 20} against {budget 0.05 20})",
    ], "path": [
        "| `path` | **held-out** | {bed layers} | ring and bar, 4 motions, a colour and a start a class (the prompt "
        "fixes the path), texture 0.5, camera pans | {bed sizes} | {bed training} | {bed losses} | {bed fit} | "
        "{bed class right} | {bed sha} |",
        "it trained longest (2000 steps, 6 layers); it too follows its class in {bed class right} and fits at "
        "{bed fit}",
        "It follows its class in {bed class right} (at a template fit of {bed fit}",
        "| `path`, 20 | {ours_error 20 / target} | {ours_error 20 / estimate} | {ours_error 20 in band} targets | "
        "{ours_taylorseer 20 / target} | {ours_taylorseer 20 / estimate} | {ours_taylorseer 20 in band} |",
        "| `path`, 40 | {ours_error 40 / target} | {ours_error 40 / estimate} | {ours_error 40 in band} | "
        "{ours_taylorseer 40 / target} | {ours_taylorseer 40 / estimate} | {ours_taylorseer 40 in band} |",
        "the defaults cost {defaults 20} and {defaults 40} (20 and 40 steps), the budgets miss at 20 steps (0.03: "
        "{budget 0.03 20}; 0.05: {budget 0.05 20}) and 0.05 at 40 ({budget 0.05 40}, as many blocks as 0.03's "
        "{budget 0.03 40}), and the frontier's best points run {frontier 20} and {frontier 40} of the blocks",
        "at 40 steps no point of ours has no more error and block cost than {peers unmatched 40}; at 20 steps "
        "{peers unmatched 20} is unmatched",
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


def assert_says(page: str, passages: list[str], source: str):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = one_line(f.read())
    for passage in passages:
        assert passage in text, f"{page} should say, from {source}: {passage}"


@pytest.mark.parametrize("page", list(QUOTED))
def test_each_quoted_figure_is_the_committed_results(page):
    for bed, passages in QUOTED[page].items():
        figures_of = figures(results(bed))
        assert_says(page, [filled(passage, figures_of) for passage in passages], f"bench/results/quality_{bed}.json")


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


def results_table(name: str) -> dict[str, dict[str, str]]:
    """The first table of bench/results/<name>.md: its first column -> {header: cell}."""
    with open(os.path.join(ROOT, "bench", "results", f"{name}.md"), encoding="utf-8") as f:
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in f if line.startswith("|")]
    header = rows[0]
    return {row[0]: dict(zip(header, row)) for row in rows[2:] if len(row) == len(header) and row[0] != header[0]}


def bench_passages() -> dict[str, list[str]]:
    """The speed figures the README gives, as it writes them, from the speed and parallel benchmarks' tables."""
    latest = results_table("latest")
    speed = {run: row["speed-up vs native"] for run, row in latest.items()}
    parallel = [float(row["speed-up vs 1 process"].rstrip("x")) for run, row in results_table("parallel").items()
                if "2 workers" in run]
    return {"README.md": [
        f"with Cache-DiT at threshold 0.24, {speed['ours, Cache-DiT at 0.24 (random weights)']} native (ComfyUI's "
        f"EasyCache {speed['native + EasyCache (defaults)']}; `bench/results/latest.md`)",
        f"Two CPU workers ran {min(parallel):.2f}x to {max(parallel):.2f}x one process here on 6144 tokens "
        "(`bench/results/parallel.md`)"]}


@pytest.mark.parametrize("page", list(bench_passages()))
def test_each_quoted_speed_figure_is_the_committed_benchmark_tables(page):
    assert_says(page, bench_passages()[page], "bench/results")


def memory_passages() -> dict[str, list[str]]:
    """The cache's memory at 720p x 81 frames (75,600 tokens of width 5,120, bf16) as the pages and the budget's
    tooltip give it, from the pack's own count (cache_bytes): plain (two tensors a prompt stream) and TaylorSeer's."""
    from wan22_cachedit.nodes.core import cache as C

    tokens, width, itemsize = 21 * 45 * 80, 5_120, 2  # 81 frames -> 21 latent frames of 45 x 80 at 720p

    def gb(size: float) -> str:
        return f"{size / 1e9:.2f}" if size < 2e9 else f"{size / 1e9:.1f}"

    def cache(streams: int, calibrator: str) -> str:
        return gb(C.cache_bytes(tokens=tokens, width=width, itemsize=itemsize, batch=1, streams=streams,
                                calibrator=calibrator))

    plain, plain1, ts, ts1 = cache(2, "none"), cache(1, "none"), cache(2, "taylorseer"), cache(1, "taylorseer")
    unit, held = gb(tokens * width * itemsize), {5: "five"}.get(C.HELD_PER_STREAM["taylorseer"], "?")
    return {
        "README.md": [f"At the defaults the cache holds {plain} GB at 720p, 81 frames and CFG > 1 ({plain1} GB at "
                      "CFG 1)"],
        "docs/stack.md": [f"{unit} GB per prompt in bf16. So the cache holds **{plain} GB** at CFG > 1 (positive and "
                          f"negative) and **{plain1} GB** at CFG 1 (LightX2V); with TaylorSeer or FoCa up to "
                          f"{held} tensors per stream, {ts} GB "
                          f"and {ts1} GB"],
        "docs/quality.md": [f"{ts} GB at 720p and CFG > 1", f"{ts} GB instead of {plain} at 720p x 81 frames and "
                                                              "CFG > 1"],
        "web/docs/Wan22CacheBudget.md": [f"({ts} GB instead of {plain} at 720p x 81 frames, CFG > 1)"],
        "nodes/budget_nodes.py": [f"720p x 81 frames and CFG > 1: {ts} GB instead of {plain})"],
    }


@pytest.mark.parametrize("page", list(memory_passages()))
def test_each_quoted_memory_figure_is_the_packs_own_count(page):
    assert_says(page, memory_passages()[page], "nodes/core/cache.py's cache_bytes")
