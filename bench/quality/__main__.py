"""python -m bench.quality: measures the beds (in parts, one thread each), judges and writes them (see the
package's docstring)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from bench.common import QUICK_NOTE, ROOT, add_output_arguments
from bench.quality import __doc__ as DOC
from bench.quality.judge import choose, pack_constants
from bench.quality.measure import bed_summary, measure_bed
from bench.quality.report import write_bed, write_summary
from bench.quality.settings import CALIBRATION, CASES, FEW_STEPS, MAIN_STEPS, RUNS


def unit_cost(unit) -> int:
    """A (bed, [steps]) unit's work, roughly: steps x layers x latent size."""
    from devtools import testbed

    config = testbed.config_of(unit[0])
    return unit[1][0] * config.num_layers * math.prod(config.measured)

def in_parts(units: list, args) -> list:
    """(bed, steps) units measured by `args.jobs` child processes of one thread each: each unit, the longest first,
    to the process with the least work so far."""
    groups, loads = [[] for _ in range(args.jobs)], [0] * args.jobs
    for unit in sorted(units, key=lambda u: -unit_cost(u)):
        i = loads.index(min(loads))
        groups[i].append(unit)
        loads[i] += unit_cost(unit)
    with tempfile.TemporaryDirectory(prefix="wan22-quality-parts-") as tmp:
        procs = []
        for i, group in enumerate(g for g in groups if g):
            part = os.path.join(tmp, f"part{i}.json")
            command = [sys.executable, "-m", "bench.quality", "--part", part, "--units", json.dumps(group)]
            command += ["--quick"] if args.quick else []
            procs.append((part, subprocess.Popen(command + (["--budgets"] if args.budgets else []), cwd=ROOT)))
        parts = []
        for part, proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"a part of the benchmark failed (exit {proc.returncode})")
            with open(part, encoding="utf-8") as f:
                parts.extend(json.load(f))
    return parts

def run_units(units: list, quick: bool, budgets_only: bool = False) -> list:
    """[(bed, steps, measurements)] for each (bed, [steps]) unit, in this process."""
    return [(name, steps, measure_bed(name, steps, quick, budgets_only=budgets_only)) for name, steps in units]

def kept_results(stem: str, bed, folder: str) -> dict:
    """--budgets: a bed's kept results, read before anything is measured. Only those of the same weights: the
    points that are not measured again stand only for the experts they were measured on."""
    path = os.path.join(folder, f"{stem}.json")
    if not os.path.exists(path):
        raise SystemExit(f"no kept results of bed {bed.name!r} ({path}): run the whole benchmark (make quality)")
    with open(path, encoding="utf-8") as f:
        kept = json.load(f)
    sha = bed_summary(bed)["sha256"]
    if kept["bed"]["sha256"] != sha:
        raise SystemExit(f"the kept results of bed {bed.name!r} are from other weights (SHA-256 "
                         f"{kept['bed']['sha256']} against {sha}): run the whole benchmark (make quality)")
    return kept

def with_new_budgets(kept: dict, bed, measured: list) -> dict:
    """A bed's kept results (kept_results) with their budget points replaced by `measured`'s."""
    new = {r["steps"]: r["points"] for m in measured for r in m["step_counts"]}
    for r in kept["step_counts"]:
        if r["steps"] in new:
            r["points"] = [p for p in r["points"] if p["method"] != "budget"] + new[r["steps"]]
    kept["bed"] = bed_summary(bed)
    if "choice" in kept:  # what the tuning bed chooses, from the same points (the choice may have grown)
        kept["choice"] = choose(kept)
    kept["note"] = (f"The budget points were measured again on {time.strftime('%Y-%m-%d')} (bench.quality "
                    "--budgets) on these weights; the other points come from the whole benchmark's last run on the "
                    "same weights (equal SHA-256).\n\n")
    return kept

def main() -> int:
    from devtools import testbed

    parser = argparse.ArgumentParser(description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bed", nargs="+", choices=list(testbed.BEDS), help="beds (default: all)")
    parser.add_argument("--steps", type=int, nargs="+", choices=list(RUNS), help="step counts (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="processes of one thread each")
    parser.add_argument("--choose", action="store_true",
                        help="print the constants the tuning bed's last results choose, beside the pack's")
    parser.add_argument("--budgets", action="store_true",
                        help="measure the error budgets' points only (20 and 40 steps), into the kept results of "
                             "the same weights (a change to the budget needs minutes, not the whole benchmark)")
    parser.add_argument("--judge", action="store_true",
                        help="judge the kept results again and rewrite their tables, measuring nothing (after a "
                             "check was added or changed)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child of --jobs: write its units here
    parser.add_argument("--units", help=argparse.SUPPRESS)
    add_output_arguments(parser, "a smoke test on a quick bed: a few points at 20 steps (quality_quick*)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.WARNING)
    if args.choose:
        with open(os.path.join(args.results_dir, "quality_tuning.json"), encoding="utf-8") as f:
            print(json.dumps({"chosen": choose(json.load(f)), "pack": pack_constants()}, indent=1))
        return 0
    if args.judge:
        beds = {}
        for name in testbed.BEDS:
            path = os.path.join(args.results_dir, f"quality_{name}.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    beds[name] = json.load(f)
                if name in (args.bed or testbed.BEDS):
                    write_bed(f"quality_{name}", beds[name], args.results_dir)
        write_summary(beds, args.results_dir, "quality")
        return 0
    if args.part:
        with open(args.part, "w", encoding="utf-8") as f:
            json.dump(run_units(json.loads(args.units), args.quick, args.budgets), f, default=str)
        return 0
    started = time.perf_counter()
    names = ["quick"] if args.quick else (args.bed or list(testbed.BEDS))
    built = {name: testbed.build(name) for name in names}  # each bed once per machine, before the measuring
    stems = {name: f"quality_{'quick' if args.quick else name}" for name in names}
    kept = {name: kept_results(stems[name], built[name], args.results_dir) for name in names if args.budgets}
    units = []
    for name in names:
        steps = args.steps or ([20] if args.quick else
                               [*MAIN_STEPS, *(FEW_STEPS if name == testbed.TUNING and not args.budgets else ())])
        units += [(name, [s]) for s in steps if s in MAIN_STEPS or not args.budgets]
    units.sort(key=lambda u: -unit_cost(u))
    measured = (in_parts(units, args) if args.jobs > 1 and len(units) > 1 else
                run_units(units, args.quick, args.budgets))
    beds = {}
    for name, bed in built.items():
        parts = [m for n, _s, m in measured if n == name]
        if args.budgets:
            beds[name] = with_new_budgets(kept[name], bed, parts)
            write_bed(stems[name], beds[name], args.results_dir)
            continue
        step_counts = sorted((r for m in parts for r in m["step_counts"]), key=lambda r: r["steps"])
        result = {"bed": bed_summary(bed), "step_counts": step_counts,
                  "single_steps": [t for m in parts for t in m.get("single_steps", [])],
                  "state": next((m["state"] for m in parts if m.get("state")), None),
                  "config": {"cases": CASES, "calibration": CALIBRATION, "quick": args.quick, "threads": 1,
                             "torch": torch.__version__, "machine": platform.machine(),
                             "cpu_count": os.cpu_count()}}
        if name == testbed.TUNING and result["single_steps"] and all(
                any(r["steps"] == s for r in step_counts) for s in MAIN_STEPS):
            result["choice"] = choose(result)
        beds[name] = result
        write_bed(f"quality_{name}", result, args.results_dir)
    if not args.quick:  # the summary keeps the beds not measured in this run as they were
        for name in testbed.BEDS:
            path = os.path.join(args.results_dir, f"quality_{name}.json")
            if name not in beds and os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    beds[name] = json.load(f)
        beds = {name: beds[name] for name in sorted(beds, key=lambda n: list(testbed.BEDS).index(n)
                                                    if n in testbed.BEDS else -1)}
    summary = "quality_summary_quick" if args.quick else "quality"  # the quick bed's own files are quality_quick
    write_summary(beds, args.results_dir, summary)
    if args.quick:
        print(QUICK_NOTE)
    print(f"[quality] {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    raise SystemExit(main())
