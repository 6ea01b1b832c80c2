"""Every benchmark of `make bench` run in its quick mode, as a command, so that a change that breaks one fails
the suite instead of `make bench`: each exits 0 and writes its *_quick results, holding what the full run writes,
into a temporary folder (never over bench/results). Counts a benchmark cannot use are refused by name before
anything starts. bench/gpu.py is tested by test_gpu_bench.py.

bench.compile's and bench.family's quick runs are marked `slow` (make test-slow, which CI runs): the two longest
after bench.quality's, they would keep `make test` over its 12 minutes.

The quick runs start together, two at a time (`quick_runs`, the longest first), and each test waits for its own:
most of them keep one core busy or wait on a server or a worker, so two side by side take about half the time
of one after another (their figures claim nothing, and nothing here is timed). Seconds each, one at a time,
measured 2026-12-06 on two CPU cores: bench.quality about 100 (its quick bed, 2 layers and 6 optimiser steps,
trains into a temporary cache: no measuring bed is trained; then the --budgets rerun), bench.family about 65
(quick VACE and TI2V-5B beds likewise), bench.compile about 50 (inductor compiles the whole model once),
bench.parallel about 25 (two Ray workers start), bench.endurance 18 (a server starts), bench.few_steps 15,
bench.run 14; the refusals well under a second all together (argparse, in this process).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from devtools.paths import ROOT

HANG_GUARD_S = 1800  # each takes well under two minutes on idle cores; this only guards against a hang
LANES = 2  # quick runs side by side: the machine's two cores


def quick(module: str, results_dir, *args, env=None) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", module, "--quick", "--results-dir", str(results_dir), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def written(results_dir, name: str) -> dict:
    path = results_dir / name
    assert path.exists(), sorted(p.name for p in results_dir.iterdir())
    return json.loads(path.read_text())


def quality_then_budgets(results_dir, env) -> tuple[dict, set]:
    """bench.quality's quick run, then its --budgets rerun into the same results: the first run's JSON and the
    files it wrote."""
    quick("bench.quality", results_dir, "--jobs", "1", env=env)
    first = written(results_dir, "quality_quick.json"), {p.name for p in results_dir.iterdir()}
    quick("bench.quality", results_dir, "--jobs", "1", "--budgets", env=env)
    return first


def with_beds(base) -> dict:
    return {**os.environ, "WAN22_TESTBED_CACHE": str(base / "beds")}  # quick beds, trained into this test's folder


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory):
    """name -> (its results folder, the future of its run): the quick run of every test selected in this module
    (test_<module>_quick), started at once, LANES at a time."""
    base = tmp_path_factory.mktemp("bench_quick")
    selected = {item.name for item in request.session.items}
    jobs = {  # the longest first, so that the lanes end together
        "bench.quality": lambda d: quality_then_budgets(d / "results", with_beds(d)),
        "bench.family": lambda d: quick("bench.family", d / "results", env=with_beds(d)),
        "bench.compile": lambda d: quick("bench.compile", d),
        "bench.parallel": lambda d: quick("bench.parallel", d),
        "bench.endurance": lambda d: quick("bench.endurance", d),
        "bench.few_steps": lambda d: quick("bench.few_steps", d),
        "bench.run": lambda d: quick("bench.run", d),
    }
    with ThreadPoolExecutor(max_workers=LANES) as pool:
        runs = {}
        for name, job in jobs.items():
            if f"test_{name.replace('.', '_')}_quick" not in selected:
                continue
            folder = base / name
            folder.mkdir()
            runs[name] = (folder, pool.submit(job, folder))
        yield runs


def finished(quick_runs, name: str):
    """(its results folder, what its run returned), once it has finished; its failure raised here."""
    folder, future = quick_runs[name]
    return folder, future.result()


def test_bench_run_quick(quick_runs):
    tmp_path, _ = finished(quick_runs, "bench.run")
    results = written(tmp_path, "latest_quick.json")
    assert list(results["variants"]) == ["native", "native_easycache", "ours", "ours_cachedit", "ours_taylorseer"]
    assert results["native_max_abs"] == 0.0 and results["acceptance"]["native_max_abs"]  # cache off: bit for bit
    assert results["config"]["quick"] and results["config"]["cache_threshold"] == results["cache_threshold"]
    # the threshold is one at which random experts cache: the cached rows time the cache, not its hooks alone
    assert results["block_forward_ratio"] > 1.0, results["variants"]["ours_cachedit"]
    assert {"overhead_share", "speedup_cached", "speedup_share", "rel_l2_cached", "beats_easycache"} <= set(
        results["acceptance"])
    assert (tmp_path / "latest_quick.md").exists() and (tmp_path / "latest_quick.png").exists()


def test_bench_endurance_quick(quick_runs):
    tmp_path, _ = finished(quick_runs, "bench.endurance")
    results = written(tmp_path, "endurance_quick.json")
    assert results["ok"] and results["prompts"] == 4
    assert results["valid_ok"] == results["valid"] == 2 and results["split_mismatches"] == []
    assert results["interrupted"] == 1 and results["invalid_clear"] == results["invalid"] == 1
    assert results["first_prompt_repeats"] and not results["rss_growth_judged"]


def test_bench_few_steps_quick(quick_runs):
    tmp_path, _ = finished(quick_runs, "bench.few_steps")
    results = written(tmp_path, "few_steps_quick.json")
    assert [r["steps"] for r in results["step_counts"]] == [4, 20] and results["config"]["quick"]
    methods = {row["method"] for row in results["rows"]}
    assert methods == {"ours_defaults", "ours_warmup1", "ours_uncapped", "easycache", "lazycache"}
    assert all(row["speedup"] > 0 and row["blocks"] > 0 for row in results["rows"])
    assert (tmp_path / "few_steps_quick.png").exists()


@pytest.mark.slow  # inductor compiles four times (about 45 s alone): make test-slow, which CI runs
def test_bench_compile_quick(quick_runs):
    tmp_path, _ = finished(quick_runs, "bench.compile")
    results = written(tmp_path, "compile_quick.json")
    assert list(results["variants"]) == [f"{mode}, cache {c}" for mode in ("eager", "whole model", "per block")
                                         for c in ("off", "on")]
    rows = results["variants"]
    assert all(row["graphs_compiled_in_timed_runs"] == 0 for row in rows.values())
    assert rows["eager, cache off"]["rel_l2"] == 0.0 and rows["eager, cache on"]["block_forward_ratio"] > 1.0
    assert results["config"]["quick"] and (tmp_path / "compile_quick.md").exists()


def test_bench_parallel_quick(quick_runs):
    pytest.importorskip("ray", reason="the parallel plan needs Ray (requirements-dev.txt)")
    pytest.importorskip("yunchang", reason="the parallel plan needs yunchang (requirements-dev.txt)")
    tmp_path, _ = finished(quick_runs, "bench.parallel")
    results = written(tmp_path, "parallel_quick.json")
    rows = results["variants"]
    assert len(rows) == 8 and results["config"]["quick"]
    for name, row in rows.items():
        if "2 workers" in name:
            assert set(row["stage_splits"].values()) == {"cfg" if name.startswith("CFG 3.5") else "ulysses"}, name
        if "cache on" in name:
            assert row["cached_steps"]["high"] or row["cached_steps"]["low"], name
    table = (tmp_path / "parallel_quick.md").read_text()
    assert "holds" not in table  # a smoke test judges no target
    for name, row in rows.items():  # ... and tables every run it measured, with what it cached
        cached = sum(len(s) for s in row.get("cached_steps", {}).values())  # cache-off runs have none
        assert f"| {name} | " in table and f"| {cached} |" in table.split(f"| {name} | ", 1)[1].split("\n", 1)[0]


def test_bench_quality_quick(quick_runs):
    tmp_path, (results, files) = finished(quick_runs, "bench.quality")
    assert results["bed"]["name"] == "quick" and results["config"]["quick"]
    [run] = results["step_counts"]
    assert run["steps"] == 20
    methods = {row["method"] for row in run["points"]}
    assert {"ours_error", "ours_threshold", "defaults", "easycache", "lazycache", "budget"} <= methods
    refused = [row for row in run["points"] if row["method"] == "budget" and "refused" in row]
    assert refused and all(row["refused_input"] == "error_budget" for row in refused)
    assert all(row["block_cost"]["median"] > 0 for row in run["points"] if "refused" not in row)
    for name in ("quality_quick.md", "quality_quick.png", "quality_summary_quick.md"):
        assert name in files, name  # written by the first run, before the --budgets rerun
    # --budgets: the budget points measured again into the kept results, the other points kept as they were
    again = written(tmp_path / "results", "quality_quick.json")
    [run_again] = again["step_counts"]
    assert [p for p in run_again["points"] if p["method"] != "budget"] == [
        p for p in run["points"] if p["method"] != "budget"]
    budgets = [p for p in run_again["points"] if p["method"] == "budget"]
    assert [p["threshold"] for p in budgets] == [p["threshold"] for p in run["points"] if p["method"] == "budget"]
    assert "measured again" in again["note"] and "measured again" in (tmp_path / "results" / "quality_quick.md"
                                                                      ).read_text()
    # ... and only on the weights the kept points were measured on
    results = tmp_path / "results" / "quality_quick.json"
    results.write_text(json.dumps({**again, "bed": {**again["bed"], "sha256": {"high": "other", "low": "other"}}}))
    refused = subprocess.run([sys.executable, "-m", "bench.quality", "--quick", "--results-dir",
                              str(tmp_path / "results"), "--jobs", "1", "--budgets"], cwd=ROOT, capture_output=True,
                             text=True, timeout=HANG_GUARD_S, env=with_beds(tmp_path))
    assert refused.returncode != 0 and "are from other weights" in refused.stderr and "make quality" in refused.stderr


@pytest.mark.slow  # two quick beds trained and measured (about 36 s alone): make test-slow, which CI runs
def test_bench_family_quick(quick_runs):
    tmp_path, _ = finished(quick_runs, "bench.family")
    results = written(tmp_path / "results", "family_quick.json")
    assert results["config"]["quick"] and results["checks"] == []
    assert {kind: bed["bed"]["name"] for kind, bed in results["beds"].items()} == {"vace": "quick_vace",
                                                                                    "ti2v": "quick_ti2v"}
    for kind, bed in results["beds"].items():
        [run] = bed["step_counts"]
        points = {p["name"]: p for p in run["points"]}
        assert points["native"]["block_cost"] == 1 and points["native"]["rel_l2"] == 0
        if kind == "ti2v":
            assert set(points) == {"native", "defaults"} and points["defaults"]["fidelity"] is None
            continue
        for setting in ("defaults", "target 0.1", "TaylorSeer"):  # the same steps cached; fresh hints run VACE blocks
            assert points[f"{setting}, fresh"]["block_cost"] >= points[f"{setting}, cached"]["block_cost"]
    table = (tmp_path / "results" / "family_quick.md").read_text()
    assert "holds" not in table  # a smoke test judges no target, and tables every point it measured
    for kind, bed in results["beds"].items():
        [run] = bed["step_counts"]
        for p in run["points"]:
            assert (f"| {bed['bed']['name']} | {run['steps']} | {p['name']} | {p['rel_l2']:.4f} | "
                    f"{p['block_cost']:.3f} |") in table


@pytest.mark.parametrize("module, args, option", [
    ("bench.run", ["--repeats", "0"], "--repeats"),
    ("bench.compile", ["--repeats", "0"], "--repeats"),
    ("bench.parallel", ["--repeats", "-1"], "--repeats"),
    ("bench.few_steps", ["--threads", "0"], "--threads"),
    ("bench.few_steps", ["--repeats", "0"], "--repeats"),
    ("bench.endurance", ["--prompts", "0"], "--prompts"),
    ("bench.endurance", ["--prompts", "4", "--interrupts", "2", "--invalid", "2"], "--prompts"),
    ("bench.endurance", ["--invalid", "4"], "--invalid"),
])
def test_counts_a_benchmark_cannot_use_are_refused_by_name(module, args, option, monkeypatch, capsys):
    """In this process (argparse refuses before anything is loaded): exit status 2, the option named."""
    import importlib

    main = importlib.import_module(module).main
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    assert option in capsys.readouterr().err
