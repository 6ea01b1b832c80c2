"""Quality on the trained test bed: what each cache costs in error, against the blocks it saves and the time.

Every point runs the official template's graph of ComfyUI's own nodes on the bed's two trained experts
(devtools/testbed.py, built once per machine and cached): per expert MODEL -> [cache node] ->
ModelSamplingSD3 -> KSamplerAdvanced (high: 0 -> switch with its leftover noise, low: switch -> end), with a
class's prompt and the negative. Per step count, for each of CASES (a seed and a class):

- native: the graph without a cache node (the reference of that seed);
- ours: Wan2.2 Cache-DiT (MODEL) on each expert, over thresholds from 0.03 to 0.3 at the node's defaults, and
  over fewer thresholds with warm-up 1, with the caps lifted, with TaylorSeer and with 2 first compute blocks;
- ComfyUI's EasyCache and LazyCache (their other inputs at their defaults), over their thresholds;
- error budgets 0.01, 0.03, 0.05: the Wan2.2 Cache-DiT Error Budget node's calibration on CALIBRATION (another
  seed and class), then the pack's sampler with the calibrated plan on each case.

Error: relative L2 (and PSNR) of the final latent against the native run of the same seed and class, the
median over the cases and their spread (min, max). Block cost: the transformer blocks run, counted by forward
hooks on the blocks, as a share of native's. Speed-up: each point's time against the mean of the native runs
just before and after it in the same case (the machine is shared: only neighbouring runs compare), the median
over the cases. Torch runs on one thread.

It then checks, and prints, what the README states: the Cache-DiT node's defaults at 20 and 40 steps (median
error at most 0.03, blocks skipped), a point of ours at no more error and no more block cost than each
EasyCache or LazyCache point that skips something at a median error of 0.1 or less, and the budgets (median
error within the budget, block cost falling as it grows, fewer blocks than the defaults at 0.05).

Writes bench/results/quality.{json,md,png} (--quick: a smoke test on a quick bed, quality_quick.*).

    .venv/bin/python -m bench.quality [--steps 20 40 ...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time

import torch

from bench.common import ROOT, Timer, finish_grid, plot_grid
from bench.few_steps import BlockCounter, Methods, round_references, with_natives
from bench.run import RESULTS, psnr_db, rel_l2

LORA_RUN = {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 1.0, "low": 1.0}}
RUNS = {4: LORA_RUN, 6: LORA_RUN, 8: LORA_RUN,
        20: {"sampler": "uni_pc", "scheduler": "simple", "flow_shift": 8.0, "cfg": {"high": 4.0, "low": 3.0}},
        40: {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 4.0, "low": 3.0}}}
CASES = [(101, 1), (202, 4), (303, 6)]  # (seed, class) of each measured run
CALIBRATION = (11, 0)  # the budget node's calibration run: another seed and class
OURS = [0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.16, 0.24, 0.3]
OURS_FEW = [0.04, 0.06, 0.1, 0.16, 0.24]
COMFY = [0.02, 0.05, 0.1, 0.2, 0.3]
BUDGETS = [0.01, 0.03, 0.05]
NATIVE_EVERY = 6
VARIANTS = {  # our variants: (thresholds, node inputs over the defaults, per expert)
    "ours": (OURS, {}, {}),
    "ours_warmup1": (OURS_FEW, {}, {"high": {"warmup_steps": 1}, "low": {"warmup_steps": 1}}),
    "ours_uncapped": (OURS_FEW, {"max_cached_steps": -1, "max_continuous_cached_steps": -1}, {}),
    "ours_taylorseer": (OURS_FEW, {"calibrator": "taylorseer"}, {}),
    "ours_f2": (OURS_FEW, {"first_compute_blocks": 2}, {}),
}
LABELS = {"ours": "Cache-DiT, threshold swept (the rest at the defaults)", "ours_warmup1": "Cache-DiT, warm-up 1",
          "ours_uncapped": "Cache-DiT, caps lifted", "ours_taylorseer": "Cache-DiT + TaylorSeer",
          "ours_f2": "Cache-DiT, 2 first compute blocks", "easycache": "ComfyUI EasyCache",
          "lazycache": "ComfyUI LazyCache", "budget": "Cache-DiT Error Budget (calibrated elsewhere)"}
COLOURS = {"ours": "#d62728", "ours_warmup1": "#ff9896", "ours_uncapped": "#8c564b", "ours_taylorseer": "#9467bd",
           "ours_f2": "#e377c2", "easycache": "#2ca02c", "lazycache": "#1f77b4", "budget": "#000000"}
FLOOR = 1e-5


def points(methods: Methods, defaults: dict, quick: bool) -> dict:
    """name -> (method, threshold, patch(role, MODEL) -> MODEL)."""
    out = {}
    for method, (thresholds, common, per_expert) in VARIANTS.items():
        if quick and method == "ours_f2":  # the quick bed has 2 layers: nothing would be left to cache
            continue
        for t in (thresholds[::4] if quick else thresholds):
            out[f"{method}@{t:g}"] = (method, t, methods.ours(t, common, per_expert))
    for kind in ("easycache", "lazycache"):
        for t in (COMFY[::2] if quick else COMFY):
            out[f"{kind}@{t:g}"] = (kind, t, methods.comfy(kind, t))
    threshold = defaults["residual_diff_threshold"]
    out["defaults"] = ("defaults", threshold, methods.ours(threshold, {}, {}))
    return out


def summarise(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_steps(runs, counter, methods, defaults, steps: int, quick: bool, log) -> dict:
    """Every point on every case at one step count, then the budgets."""
    run = {**RUNS[steps], "steps": steps}
    named = points(methods, defaults, quick)
    timer = Timer(torch.device("cpu"))
    per_point = {name: {"rel_l2": [], "psnr": [], "cost": [], "speedup": []} for name in named}
    native_blocks, native_s = [], []
    for seed, cls in CASES:
        blocks, timed = {}, {}

        def runner(name, patch):
            def go():
                counter.count = 0
                out = runs.run(run, seed, cls, patch)
                blocks[name] = counter.count
                return out
            return go

        order, before = with_natives(runner("native", None), {n: runner(n, p) for n, (_m, _t, p) in named.items()},
                                     NATIVE_EVERY)
        for name, go in order.items():
            latent, seconds = timer(go)
            timed[name] = (latent, seconds, [seconds])
        reference = timed["native#0"][0]
        native_blocks.append(blocks["native"])
        native_s += [s for n, (_l, s, _a) in timed.items() if n.startswith("native")]
        references = round_references(timed, before)
        for name in named:
            latent, seconds, _ = timed[name]
            point = per_point[name]
            point["rel_l2"].append(rel_l2(reference, latent))
            point["psnr"].append(psnr_db(reference, latent))
            point["cost"].append(blocks[name] / blocks["native"])
            point["speedup"].append(references[name][0] / seconds)
        log(f"[quality] {steps} steps, seed {seed} class {cls}: {len(named)} points")
    rows = []
    for name, (method, threshold, _patch) in named.items():
        p = per_point[name]
        rows.append({"method": method, "threshold": threshold, "rel_l2": summarise(p["rel_l2"]),
                     "psnr_db": summarise(p["psnr"]), "block_cost": summarise(p["cost"]),
                     "speedup": statistics.median(p["speedup"]), "per_case": p})
    rows += measure_budgets(runs, counter, run, quick, log)
    return {"steps": steps, **run, "split": list(runs.schedule(run).split), "native_blocks": native_blocks[0],
            "native_median_s": statistics.median(native_s), "points": rows}


def measure_budgets(runs, counter, run: dict, quick: bool, log) -> list:
    """Each budget calibrated once on CALIBRATION, then run on every case by the pack's sampler."""
    from bench.quality_runs import LATENT

    budget_nodes = runs.comfy.pack("nodes.budget_nodes")
    errors = runs.comfy.pack("nodes.core.errors")
    plan = runs.comfy.pack("nodes.core.cache").CachePlan()
    seed, cls = CALIBRATION
    positive, negative = runs.conditioning(cls)
    schedule = runs.schedule(run)
    rows = []
    for budget in (BUDGETS[1:2] if quick else BUDGETS):
        started = time.perf_counter()
        try:
            experts, calibration = budget_nodes.calibrate(runs.experts.replace(cache_plan=plan), schedule, positive,
                                                          negative, {"samples": torch.zeros(LATENT)}, seed,
                                                          dict(run["cfg"]), budget)
        except errors.Wan22InputError as refused:
            rows.append({"method": "budget", "threshold": budget, "refused": str(refused)})
            log(f"[quality] budget {budget}: {refused}")
            continue
        seconds = time.perf_counter() - started
        errs, costs = [], []
        for case_seed, case_cls in CASES:
            counter.count = 0
            reference = runs.run(run, case_seed, case_cls)
            native_blocks, counter.count = counter.count, 0
            latent, _record = runs.ours(run, case_seed, case_cls, experts.cache_plan)
            costs.append(counter.count / native_blocks)
            errs.append(rel_l2(reference, latent))
        rows.append({"method": "budget", "threshold": budget, "rel_l2": summarise(errs), "block_cost": summarise(costs),
                     "thresholds": calibration.thresholds, "calibration_error": calibration.error,
                     "confirmation_error": calibration.confirmation_error,
                     "calibration_runs": len(calibration.trials) + len(calibration.confirmations)
                     + (2 if calibration.confirmations else 1),  # and the uncached runs
                     "calibration_s": round(seconds, 1),
                     "per_case": {"rel_l2": errs, "cost": costs}})
        log(f"[quality] budget {budget}: {calibration.describe()}; median error on the cases "
            f"{statistics.median(errs):.4f}")
    return rows


# --- what the README states, checked ---

def checks(results: list) -> list[dict]:
    out = []
    by_steps = {r["steps"]: r for r in results}
    for steps in (20, 40):
        r = by_steps.get(steps)
        if r is None:
            continue
        d = next(p for p in r["points"] if p["method"] == "defaults")
        out.append({"check": f"{steps} steps: the Cache-DiT node's defaults cost a median relative L2 <= 0.03 and "
                             "skip blocks", "value": f"{d['rel_l2']['median']:.4f} at block cost "
                                                     f"{d['block_cost']['median']:.3f}",
                    "holds": d["rel_l2"]["median"] <= 0.03 and d["block_cost"]["median"] < 1})
        ours = [p for p in r["points"] if p["method"].startswith("ours") or p["method"] == "defaults"]
        for theirs in (p for p in r["points"] if p["method"] in ("easycache", "lazycache")):
            if not (theirs["block_cost"]["median"] < 1 and theirs["rel_l2"]["median"] <= 0.1):
                continue
            match = [p for p in ours if p["rel_l2"]["median"] <= theirs["rel_l2"]["median"]
                     and p["block_cost"]["median"] <= theirs["block_cost"]["median"]]
            best = min(match, key=lambda p: (p["block_cost"]["median"], p["rel_l2"]["median"]), default=None)
            out.append({"check": f"{steps} steps: a point of ours at no more error and block cost than "
                                 f"{theirs['method']} {theirs['threshold']:g} ({theirs['rel_l2']['median']:.4f}, "
                                 f"{theirs['block_cost']['median']:.3f})",
                        "value": "none" if best is None else f"{best['method']} {best['threshold']:g} "
                                                             f"({best['rel_l2']['median']:.4f}, "
                                                             f"{best['block_cost']['median']:.3f})",
                        "holds": best is not None})
        budgets = [p for p in r["points"] if p["method"] == "budget" and "refused" not in p]
        for p in budgets:
            out.append({"check": f"{steps} steps: budget {p['threshold']:g} met (median of the cases)",
                        "value": f"{p['rel_l2']['median']:.4f} at block cost {p['block_cost']['median']:.3f}",
                        "holds": p["rel_l2"]["median"] <= p["threshold"]})
        if len(budgets) == len(BUDGETS):
            costs = [p["block_cost"]["median"] for p in budgets]
            out.append({"check": f"{steps} steps: block cost falls as the budget grows",
                        "value": " > ".join(f"{c:.3f}" for c in costs),
                        "holds": all(a >= b for a, b in zip(costs, costs[1:])) and costs[0] > costs[-1]})
            out.append({"check": f"{steps} steps: budget 0.05 computes fewer blocks than the defaults",
                        "value": f"{costs[-1]:.3f} against {d['block_cost']['median']:.3f}",
                        "holds": costs[-1] < d["block_cost"]["median"]})
    return out


def table(results: list) -> str:
    lines = ["| steps | split | method | threshold | rel. L2 median [min, max] | PSNR dB | block cost | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        split = "/".join(map(str, r["split"]))
        lines.append(f"| {r['steps']} | {split} | native ({r['native_median_s']:.2f} s) | - | 0 | - | 1.000 | 1.00x |")
        for p in r["points"]:
            label = LABELS.get(p["method"], "Cache-DiT node defaults")
            if "refused" in p:
                lines.append(f"| {r['steps']} | {split} | {label} | {p['threshold']:g} | refused: "
                             f"{p['refused'][:90]} | - | - | - |")
                continue
            e, c = p["rel_l2"], p["block_cost"]
            psnr = f"{p['psnr_db']['median']:.1f}" if "psnr_db" in p else "-"
            speed = f"{p['speedup']:.2f}x" if "speedup" in p else "-"
            extra = ("" if "thresholds" not in p else " (" + ", ".join(
                f"{k} {'off' if v is None else f'{v:g}'}" for k, v in p["thresholds"].items()) + ")")
            lines.append(f"| {r['steps']} | {split} | {label}{extra} | {p['threshold']:g} | {e['median']:.4f} "
                         f"[{e['min']:.4f}, {e['max']:.4f}] | {psnr} | {c['median']:.3f} | {speed} |")
    return "\n".join(lines)


def chart(results: list, path: str, title: str) -> None:
    fig, axes = plot_grid(len(results), 5.4, 4.4)
    for ax, r in zip(axes.flat, results):
        for method, label in LABELS.items():
            pts = sorted((p for p in r["points"] if p["method"] == method and "refused" not in p),
                         key=lambda p: p["threshold"])
            if pts:
                ax.plot([max(p["rel_l2"]["median"], FLOOR) for p in pts], [p["block_cost"]["median"] for p in pts],
                        marker="s" if method == "budget" else "o", markersize=4, color=COLOURS[method], label=label,
                        linestyle=":" if method == "budget" else "-")
        d = next(p for p in r["points"] if p["method"] == "defaults")
        ax.plot([max(d["rel_l2"]["median"], FLOOR)], [d["block_cost"]["median"]], marker="*", markersize=12,
                color="#ff7f0e", linestyle="none", label="Cache-DiT node defaults")
        ax.axvline(0.03, color="#888888", linewidth=0.7, linestyle="--")
        ax.set_xscale("log")
        ax.set_title(f"{r['steps']} steps {r['sampler']}, shift {r['flow_shift']:g}, CFG {r['cfg']['high']:g}/"
                     f"{r['cfg']['low']:g}, split {r['split'][0]}/{r['split'][1]}", fontsize=9)
        ax.set_xlabel(f"median relative L2 to the uncached latent ({len(CASES)} seeds x classes)", fontsize=8)
        ax.set_ylabel("block forwards, share of uncached", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    finish_grid(fig, axes, len(results), title, path)


def bed_line(bed: dict) -> str:
    gen, losses = bed["generation"], bed["losses"]
    return (f"Bed `{bed['key']}`: {bed['config']['num_layers']} layers, trained {bed['training_wall_s']:.0f} s; "
            f"validation loss high {losses['high']['first_validation']:.3f} -> "
            f"{losses['high']['best_validation']:.3f}, low {losses['low']['first_validation']:.3f} -> "
            f"{losses['low']['best_validation']:.3f}; samples fit a template at {gen['template_fit_mean']:.3f} "
            f"(clean data {gen['clean_data_fit_mean']:.3f}, noise 1.0), class right in {gen['class_right']} of "
            f"{gen['of']} at CFG 4.")


def write(name: str, out: dict) -> None:
    """bench/results/{name}.json, .md (the bed, the table, the checks) and .png; printed too."""
    results = out["step_counts"]
    out["checks"] = held = checks(results)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=str)
    text = table(results)
    check_lines = "\n".join(["| check | measured | holds |", "|---|---|---|"] +
                            [f"| {c['check']} | {c['value']} | {'yes' if c['holds'] else 'NO'} |" for c in held])
    note = out.get("note", "")
    with open(os.path.join(RESULTS, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(f"# Quality on the trained test bed (cpu)\n\n{bed_line(out['bed'])}\n\n{text}\n\n{check_lines}\n\n"
                f"{note}Plot: `{name}.png`. Config: `{json.dumps(out['config'])}`\n")
    chart(results, os.path.join(RESULTS, f"{name}.png"),
          "Caches on the trained tiny Wan2.2 bed: block cost against error (median of "
          f"{len(CASES)} seeds x classes, CPU)")
    print(bed_line(out["bed"]))
    print(text)
    print(check_lines)
    print(f"[quality] written: {os.path.join(RESULTS, name)}.json, .md, .png")


def render(name: str) -> None:
    """Writes a measured result again with the Cache-DiT node's current defaults: their point is the swept point
    with the same settings (the defaults changed their threshold only, to one the sweep measured)."""
    from devtools.paths import import_pack

    import_pack()
    from wan22_cachedit.nodes.core.cache import CachePlan

    with open(os.path.join(RESULTS, f"{name}.json"), encoding="utf-8") as f:
        out = json.load(f)
    defaults = CachePlan().node_inputs()
    others = {k: v for k, v in defaults.items() if k != "residual_diff_threshold"}
    if others != {k: v for k, v in out["config"]["defaults"].items() if k != "residual_diff_threshold"}:
        raise SystemExit("the defaults changed more than their threshold: measure again")
    threshold = defaults["residual_diff_threshold"]
    for r in out["step_counts"]:
        swept = next((p for p in r["points"] if p["method"] == "ours" and p["threshold"] == threshold), None)
        if swept is None:
            raise SystemExit(f"threshold {threshold} was not swept: measure again")
        r["points"] = [p for p in r["points"] if p["method"] != "defaults"] + [{**swept, "method": "defaults"}]
    out["config"]["defaults"] = defaults
    out["note"] = (f"The defaults' point is the swept point at threshold {threshold:g} with the other inputs at "
                   "the defaults (the same settings).\n\n")
    write(name, out)


def remeasure_budgets(args) -> None:
    """The budgets of the last result measured again at --steps (after a change to the budget's search)."""
    import tempfile

    from devtools import testbed
    from bench.quality_runs import BedRuns

    name = args.out or ("quality_quick" if args.quick else "quality")
    with open(os.path.join(RESULTS, f"{name}.json"), encoding="utf-8") as f:
        out = json.load(f)
    bed = testbed.load_bed(testbed.bed_folder(testbed.script_key() + ("-quick" if args.quick else "")))
    runs = BedRuns(tempfile.mkdtemp(prefix="wan22-quality-"), bed)
    counter = BlockCounter(runs.models)
    for r in out["step_counts"]:
        if args.steps and r["steps"] in args.steps:
            run = {**RUNS[r["steps"]], "steps": r["steps"]}
            r["points"] = ([p for p in r["points"] if p["method"] != "budget"]
                           + measure_budgets(runs, counter, run, args.quick, print))
    write(name, out)


def in_parts(step_counts: list, args) -> tuple[list, dict]:
    """The step counts measured by `args.jobs` child processes side by side (the longest alone), merged."""
    import subprocess
    import sys
    import tempfile

    ordered = sorted(step_counts, reverse=True)
    groups = [[ordered[0]], ordered[1:]] if args.jobs == 2 else [ordered[i::args.jobs] for i in range(args.jobs)]
    with tempfile.TemporaryDirectory(prefix="wan22-quality-parts-") as tmp:
        procs = []
        for i, group in enumerate(g for g in groups if g):
            part = os.path.join(tmp, f"part{i}.json")
            command = [sys.executable, "-m", "bench.quality", "--part", part, "--steps", *map(str, group)]
            procs.append((part, subprocess.Popen(command + (["--quick"] if args.quick else []), cwd=ROOT)))
        parts = []
        for part, proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"a part of the benchmark failed (exit {proc.returncode})")
            with open(part, encoding="utf-8") as f:
                parts.append(json.load(f))
    by_steps = {r["steps"]: r for part in parts for r in part["step_counts"]}
    return [by_steps[s] for s in step_counts], parts[0]["defaults"]


def main() -> int:
    import tempfile

    from devtools import testbed
    from bench.quality_runs import BedRuns

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", choices=list(RUNS), help="step counts (default: all)")
    parser.add_argument("--quick", action="store_true", help="smoke test: a quick bed, a few points, 4 and 20 steps")
    parser.add_argument("--out", default=None, help="result name (default quality, or quality_quick)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="processes of one thread each, the step counts shared out (40 steps alone)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child of --jobs: write its step counts here
    parser.add_argument("--budgets", action="store_true",
                        help="measure the error budgets again (--steps) into the last result, the rest kept")
    parser.add_argument("--render", action="store_true",
                        help="write the last result again with the node's current defaults (no runs)")
    args = parser.parse_args()
    if args.render:
        render(args.out or ("quality_quick" if args.quick else "quality"))
        return 0
    if args.budgets:
        remeasure_budgets(args)
        return 0
    torch.set_num_threads(1)
    started = time.perf_counter()
    config = testbed.QUICK if args.quick else testbed.BedConfig()
    folder = testbed.bed_folder(testbed.script_key() + ("-quick" if args.quick else ""))
    bed = testbed.build(config, folder=folder)  # once per machine: from the cache after the first time
    step_counts = args.steps or ([4, 20] if args.quick else list(RUNS))
    logging.getLogger().setLevel(logging.WARNING)
    if args.jobs > 1 and len(step_counts) > 1 and not args.part:
        results, defaults = in_parts(step_counts, args)
    else:
        runs = BedRuns(tempfile.mkdtemp(prefix="wan22-quality-"), bed)
        counter, methods = BlockCounter(runs.models), Methods(runs.comfy)
        defaults = runs.comfy.pack("nodes.core.cache").CachePlan().node_inputs()
        runs.run({**LORA_RUN, "steps": 4}, 1, 0)  # untimed: first calls
        results = []
        for steps in step_counts:
            begun = time.perf_counter()
            results.append(measure_steps(runs, counter, methods, defaults, steps, args.quick, print))
            print(f"[quality] {steps} steps in {time.perf_counter() - begun:.0f} s", flush=True)
        if args.part:
            with open(args.part, "w", encoding="utf-8") as f:
                json.dump({"step_counts": results, "defaults": defaults}, f, default=str)
            return 0
    bed_summary = {k: bed.log[k] for k in ("key", "config", "training_wall_s", "sha256", "generation")}
    bed_summary["losses"] = {role: {k: t[k] for k in ("first_validation", "best_validation", "best_step", "steps",
                                                       "stopped", "seconds")}
                             for role, t in bed.log["training"].items()}
    run_config = {"cases": CASES, "calibration": CALIBRATION, "quick": args.quick, "threads": 1,
                  "wall_s": round(time.perf_counter() - started, 1), "torch": torch.__version__,
                  "machine": platform.machine(), "cpu_count": os.cpu_count(), "defaults": defaults}
    write(args.out or ("quality_quick" if args.quick else "quality"),
          {"config": run_config, "bed": bed_summary, "step_counts": results})
    print(f"[quality] {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if ROOT not in __import__("sys").path:
        __import__("sys").path.insert(0, ROOT)
    raise SystemExit(main())
