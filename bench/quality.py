"""Quality on the trained test beds: what each cache costs in error, against the blocks it saves and the time.

Every point runs the official template's graph of ComfyUI's own nodes on a bed's two trained experts
(devtools/testbed.py: several beds, each built once per machine and cached; `tuning` is the only one any default
is chosen on, the others are held out): per expert MODEL -> [cache node] -> ModelSamplingSD3 -> KSamplerAdvanced
(high: 0 -> switch with its leftover noise, low: switch -> end), with a class's prompt and the negative. Per bed
and step count (20 and 40 on every bed, and the few-step LoRA runs 4, 6, 8 on the tuning bed), for each of CASES
(a seed and a class):

- native: the graph without a cache node (the reference of that seed);
- ours: Wan2.2 Cache-DiT (MODEL) on each expert, with the error criterion over error targets (alone and with
  cache-dit's TaylorSeer calibrator), and with the threshold criterion over thresholds (the rest of its inputs
  at the node's defaults); the node's defaults;
- ComfyUI's EasyCache and LazyCache (their other inputs at their defaults), over their thresholds;
- Spectrum (ComfyUI-Spectrum-WAN-Proper, unmodified, from ../shared/third_party; bench/peers.py), at its
  defaults, over its window and warm-up, and with its bias_shift transition: skipped, saying why, where it is
  not there;
- error budgets 0.03 and 0.05: the Wan2.2 Cache-DiT Error Budget node's calibration on CALIBRATION (another seed
  and class) with its default calibration_size (a smaller latent, confirmed once at full size; on a bed trained
  at several sizes, its smallest), then the pack's sampler with the calibrated plan on each case; what the
  calibration cost, in full-size uncached runs of transformer work; and a budget below any cached step's change,
  which must be refused naming error_budget.

On the tuning bed it also measures the single-step table (each step cached alone, DBCache's reuse, against the
cache's miss the error criterion measures there and the sampler's stride), which the criterion's one unmeasured
factor, its propagation, is chosen on, and whether each peer keeps state between queued runs on ComfyUI's cached
MODEL. For every point of the error criterion it keeps the nodes' own estimate of the error beside the measured
one (the band check: measured within BAND x the target and x the estimate, for targets 0.01 to 0.05).

Error: relative L2 (and PSNR) of the final latent against the native run of the same seed and class, the
median over the cases and their spread (min, max). Block cost: the transformer blocks run, counted by forward
hooks on the blocks, as a share of native's. Speed-up: each point's time against the mean of the native runs
just before and after it in the same case (the machine is shared: only neighbouring runs compare), the median
over the cases. Torch runs on one thread.

It then checks, per bed, what the README states: the Cache-DiT node's defaults at 20 and 40 steps (median error
at most 0.03, block cost at most 0.85), the budgets (median error within the budget, block cost falling as it
grows, the refusal, the calibration's work at most 3 full runs), and a point of ours at no more error and no
more block cost than each peer point that skips something at a median error of 0.1 or less. `choose` derives
the pack's error-criterion constants and default target from the tuning bed's results alone (a test holds the
pack to them).

Writes bench/results/quality_<bed>.{json,md,png} and quality.md (the beds side by side, every check);
--quick is a smoke test on a quick bed (a few points, 20 steps; quality_quick.*, its figures claim nothing).

    .venv/bin/python -m bench.quality [--bed tuning deep wide] [--steps 20 40 ...] [--jobs 2] [--quick]
    .venv/bin/python -m bench.quality --choose     # the constants the tuning bed's results choose
    .venv/bin/python -m bench.quality --budgets    # the budgets' points again, into the kept results (minutes)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from bench.common import QUICK_NOTE, ROOT, Timer, add_output_arguments, finish_grid, plot_grid
from bench.few_steps import BlockCounter, Methods, round_references, with_natives
from bench.peers import (SPECTRUM_BACKENDS, SPECTRUM_DEFAULTS, spectrum_missing, spectrum_node, spectrum_patch,
                         spectrum_restore)
from bench.run import psnr_db, rel_l2

LORA_RUN = {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 1.0, "low": 1.0}}
RUNS = {4: LORA_RUN, 6: LORA_RUN, 8: LORA_RUN,
        20: {"sampler": "uni_pc", "scheduler": "simple", "flow_shift": 8.0, "cfg": {"high": 4.0, "low": 3.0}},
        40: {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 4.0, "low": 3.0}}}
MAIN_STEPS, FEW_STEPS = (20, 40), (4, 6, 8)
CASES = [(101, 1), (202, 4), (303, 6)]  # (seed, class) of each measured run
CALIBRATION = (11, 0)  # the budget node's calibration run: another seed and class
TARGETS = [0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275, 0.03, 0.04, 0.05, 0.07, 0.1]
TAYLORSEER = [0.015, 0.02, 0.03, 0.05]  # the error criterion with cache-dit's TaylorSeer calibrator
THRESHOLDS = [0.03, 0.05, 0.08, 0.12, 0.16, 0.24]
COMFY = [0.02, 0.05, 0.1, 0.2, 0.3]
SPECTRUM = {"defaults": {}, "window 1.5": {"window_size": 1.5}, "window 3": {"window_size": 3.0},
            "window 4": {"window_size": 4.0}, "warm-up 3": {"warmup_steps": 3}, "warm-up 8": {"warmup_steps": 8},
            "bias_shift": {"transition_mode": "bias_shift"}}
BUDGETS = [0.03, 0.05]
REFUSED_BUDGET = 0.0005  # below any cached step's change on the beds: must be refused naming error_budget
QUICK_REFUSED_BUDGET = 1e-6  # ... on the quick bed, whose barely trained experts cache a step for less
MAX_BUDGET_WORK = 3.0  # full-size uncached runs a budget's calibration may cost
DEFAULTS_BOUND = {"rel_l2": 0.03, "block_cost": 0.85}
CHOICE_MARGIN = 2 / 3  # the default target is chosen to keep the tuning bed at 2/3 of the error bound
BAND = (0.67, 1.5)  # a target means its number: the measured median error within this share of it and of the estimate
BAND_TARGETS = (0.01, 0.05)  # the targets the band is checked at
NATIVE_EVERY = 6
LABELS = {"ours_error": "Cache-DiT, error criterion (target swept)",
          "ours_taylorseer": "Cache-DiT, error criterion + TaylorSeer (target swept)",
          "ours_threshold": "Cache-DiT, threshold criterion (threshold swept)",
          "defaults": "Cache-DiT node defaults", "easycache": "ComfyUI EasyCache", "lazycache": "ComfyUI LazyCache",
          "spectrum": "Spectrum-WAN", "budget": "Cache-DiT Error Budget (calibrated elsewhere)"}
COLOURS = {"ours_error": "#d62728", "ours_taylorseer": "#e377c2", "ours_threshold": "#8c564b", "defaults": "#ff7f0e",
           "easycache": "#2ca02c", "lazycache": "#1f77b4", "spectrum": "#9467bd", "budget": "#000000"}
OURS = ("ours_error", "ours_taylorseer", "ours_threshold", "defaults", "budget")
FLOOR = 1e-5


# --- the points ---

def points(runs, methods: Methods, steps: int, quick: bool) -> dict:
    """name -> (method, parameter, patch(role, MODEL) -> MODEL) for one bed and step count."""
    defaults = runs.comfy.pack("nodes.core.cache").CachePlan().node_inputs()
    out = {}
    error = {"criterion": "error"}
    for t in (TARGETS[1::3] if quick else TARGETS):
        out[f"ours_error@{t:g}"] = ("ours_error", t, methods.ours(defaults["residual_diff_threshold"],
                                                                  {**error, "error_target": t}, {}))
    for t in ([] if quick else TAYLORSEER):
        out[f"ours_taylorseer@{t:g}"] = ("ours_taylorseer", t, methods.ours(
            defaults["residual_diff_threshold"], {**error, "error_target": t, "calibrator": "taylorseer"}, {}))
    for t in (THRESHOLDS[1::3] if quick else THRESHOLDS):
        out[f"ours_threshold@{t:g}"] = ("ours_threshold", t, methods.ours(t, {"criterion": "threshold"}, {}))
    node = {"criterion": defaults["criterion"], "error_target": defaults["error_target"]}
    out["defaults"] = ("defaults", defaults["error_target"], methods.ours(defaults["residual_diff_threshold"], node,
                                                                         {}))
    for kind in ("easycache", "lazycache"):
        for t in (COMFY[::2] if quick else COMFY):
            out[f"{kind}@{t:g}"] = (kind, t, methods.comfy(kind, t))
    if steps in MAIN_STEPS and spectrum_missing() is None:
        for name, inputs in (list(SPECTRUM.items())[:1] if quick else SPECTRUM.items()):
            out[f"spectrum@{name}"] = ("spectrum", name, spectrum_patch(runs.comfy, **inputs))
    return out


def spectrum_applied_once(harness):
    """Spectrum as a graph applies it: its node once per expert, nothing taken off after (measure_state)."""
    node = spectrum_node(harness)

    def patch(role, model):
        return node().apply(model=model, **{**SPECTRUM_DEFAULTS, "backend": SPECTRUM_BACKENDS[role]})[0]
    return patch


def summarise(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def estimate_of(models: dict, key: str) -> float | None:
    """What the Cache-DiT MODEL nodes on a run's patched MODELs estimated its error to be: the sum of their last
    sample calls' estimates (core.cache.error_shares: a cache's errors add up), None where they report none;
    `key`: their wrappers' (stage_cache.KEY)."""
    import comfy.patcher_extension

    found = []
    for model in models.values():
        for wrapper in model.wrappers.get(comfy.patcher_extension.WrappersMP.SAMPLER_SAMPLE, {}).get(key, []):
            stats = getattr(getattr(wrapper, "__self__", None), "last_statistics", None)
            if stats is not None and stats.get("estimated_error") is not None:
                found.append(stats["estimated_error"])
    return sum(found) if found else None


def measure_steps(runs, counter, methods, steps: int, quick: bool, log) -> dict:
    """Every point on every case at one step count (timed between neighbouring native runs), then the budgets."""
    run = {**RUNS[steps], "steps": steps}
    named = points(runs, methods, steps, quick)
    timer = Timer(torch.device("cpu"))
    per_point = {name: {"rel_l2": [], "psnr": [], "cost": [], "speedup": [], "estimate": []} for name in named}
    native_blocks, native_s = [], []
    for seed, cls in CASES[:1] if quick else CASES:
        blocks, timed, estimates = {}, {}, {}
        stage_key = runs.comfy.pack("nodes.stage_cache").KEY

        def runner(name, patch):
            def go():
                counter.count = 0
                patched = {}

                def keep(role, model):  # the patched MODELs, whose cache nodes report their estimate
                    patched[role] = patch(role, model)
                    return patched[role]
                out = runs.run(run, seed, cls, None if patch is None else keep)
                blocks[name] = counter.count
                estimates[name] = estimate_of(patched, stage_key)
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
            point["estimate"].append(estimates[name])
        log(f"[quality] {runs.bed.name}, {steps} steps, seed {seed} class {cls}: {len(named)} points")
    rows = []
    for name, (method, parameter, _patch) in named.items():
        p = per_point[name]
        row = {"method": method, "threshold": parameter, "rel_l2": summarise(p["rel_l2"]),
               "psnr_db": summarise(p["psnr"]), "block_cost": summarise(p["cost"]),
               "speedup": statistics.median(p["speedup"]), "per_case": p}
        if all(e is not None for e in p["estimate"]):
            row["estimate"] = summarise(p["estimate"])
        rows.append(row)
    if steps in MAIN_STEPS:
        rows += measure_budgets(runs, counter, run, quick, log)
    return {"steps": steps, **run, "split": list(runs.schedule(run).split), "native_blocks": native_blocks[0],
            "native_median_s": statistics.median(native_s), "points": rows}


def measure_budgets(runs, counter, run: dict, quick: bool, log) -> list:
    """Each budget calibrated once on CALIBRATION (the node's default calibration_size; a bed trained at several
    sizes calibrates at its smallest), then run on every case by the pack's sampler; and a budget below any
    cached step (REFUSED_BUDGET, on the quick bed QUICK_REFUSED_BUDGET)."""
    budget_nodes = runs.comfy.pack("nodes.budget_nodes")
    errors = runs.comfy.pack("nodes.core.errors")
    plan = runs.comfy.pack("nodes.core.cache").CachePlan()
    seed, cls = CALIBRATION
    positive, negative = runs.conditioning(cls)
    handle = runs.comfy.pack("nodes.types").ScheduleHandle(runs.schedule(run))
    sizes = runs.bed.config.sizes
    defaults = {i.id: getattr(i, "default", None) for i in budget_nodes.Wan22CacheBudget.define_schema().inputs}
    size = (sizes[0][1] / sizes[-1][1]) if len(sizes) > 1 else defaults["calibration_size"]
    rows = []
    below = QUICK_REFUSED_BUDGET if quick else REFUSED_BUDGET
    for budget in [below, *(BUDGETS[:1] if quick else BUDGETS)]:
        started = time.perf_counter()
        try:
            experts, calibration = budget_nodes.calibrate(runs.experts.replace(cache_plan=plan), handle, positive,
                                                          negative, runs.latent(), seed, dict(run["cfg"]), budget,
                                                          size, defaults["calibrators"])
        except errors.Wan22InputError as refused:
            rows.append({"method": "budget", "threshold": budget, "refused": str(refused),
                         "refused_input": refused.input_name})
            log(f"[quality] budget {budget}: {refused}")
            continue
        seconds = time.perf_counter() - started
        errs, costs = [], []
        for case_seed, case_cls in CASES[:1] if quick else CASES:
            counter.count = 0
            reference = runs.run(run, case_seed, case_cls)
            native_blocks, counter.count = counter.count, 0
            latent, _record = runs.ours(run, case_seed, case_cls, experts.cache_plan)
            costs.append(counter.count / native_blocks)
            errs.append(rel_l2(reference, latent))
        rows.append({"method": "budget", "threshold": budget, "rel_l2": summarise(errs), "block_cost": summarise(costs),
                     "error_target": calibration.target, "calibration_size": size,
                     "calibration": budget_nodes.calibration_report(calibration),
                     "work_in_full_runs": calibration.work, "calibration_s": round(seconds, 1),
                     "per_case": {"rel_l2": errs, "cost": costs}})
        log(f"[quality] budget {budget}: {calibration.describe()}; median error on the cases "
            f"{statistics.median(errs):.4f}")
    return rows


# --- the tuning bed's own tables: single steps, and the peers' state between queued runs ---

def measure_single_steps(runs, steps: int, quick: bool, log) -> dict:
    """Each step cached alone (DBCache's reuse: warm-up up to it, one cached step, a threshold that always
    caches) on each case, its error against the uncached run; and at every step the residual change cache-dit
    sees and the cache's miss the error criterion measures (`misses`: as a share of the final latent, what a
    step cached there would miss the model's guided output by; a run of the criterion at a target too small to
    cache anything, so every step is computed and compared)."""
    core = runs.comfy.pack("nodes.core.cache")
    settings = core.ExpertCacheSettings
    run = {**RUNS[steps], "steps": steps}
    schedule = runs.schedule(run)
    sigmas, switch = list(schedule.sigmas), schedule.high_steps

    def plan(high, low, threshold):
        return core.CachePlan(criterion="threshold", residual_diff_threshold=threshold, high=high, low=low,
                              max_continuous_cached_steps=-1)
    cases = []
    for seed, cls in CASES[:1] if quick else CASES:
        reference, _ = runs.ours(run, seed, cls, None)
        _, record = runs.ours(run, seed, cls, core.CachePlan(error_target=1e-9, high=settings(1, -1),
                                                             low=settings(1, -1)))
        diffs, misses = {}, {}
        for role, off in (("high", 0), ("low", switch)):
            compared = sorted((int(k), v) for k, v in record.cache[role]["residual_diffs"].items() if v > 0)
            for (k, diff), rho in zip(compared, record.cache[role]["miss_per_change"]):
                diffs[off + k], misses[off + k] = diff, rho * diff
        skips = {}
        for j in [k for k in range(1, steps) if k != switch][::7 if quick else 1]:
            high, low = ((settings(j, 1), settings(0, 0)) if j < switch else
                         (settings(0, 0), settings(j - switch, 1)))
            latent, _ = runs.ours(run, seed, cls, plan(high, low, 1.0))
            skips[j] = rel_l2(reference, latent)
        cases.append({"seed": seed, "class": cls, "diffs": diffs, "misses": misses, "skips": skips})
        log(f"[quality] single steps, {steps} steps, seed {seed}")
    return {"steps": steps, "sigmas": sigmas, "switch": switch, "cases": cases}


def measure_state(runs, methods, log) -> dict:
    """Per peer at 20 steps: the same patched MODELs queued for seed A, then B, then A again (does the third run
    equal the first?), and an uncached run after them (does it equal one before?)."""
    run = {**RUNS[20], "steps": 20}
    (a_seed, a_cls), (b_seed, b_cls) = CASES[:2]
    peers = {"ours (error criterion)": methods.ours(0.05, {"criterion": "error", "error_target": 0.03}, {}),
             "easycache": methods.comfy("easycache", 0.2), "lazycache": methods.comfy("lazycache", 0.2)}
    if spectrum_missing() is None:
        peers["spectrum (its node applied once, as a graph does)"] = spectrum_applied_once(runs.comfy)
    out = {}
    for name, patch in peers.items():
        before = runs.run(run, a_seed, a_cls)
        patched = {role: patch(role, m) for role, m in runs.models.items()}
        first = runs.run(run, a_seed, a_cls, lambda role, _m: patched[role])
        runs.run(run, b_seed, b_cls, lambda role, _m: patched[role])
        again = runs.run(run, a_seed, a_cls, lambda role, _m: patched[role])
        after = runs.run(run, a_seed, a_cls)
        out[name] = {"queued_again_equals_first": bool(torch.equal(first, again)),
                     "uncached_after_equals_before": bool(torch.equal(before, after)),
                     "queued_again_rel_l2": rel_l2(first, again), "uncached_after_rel_l2": rel_l2(before, after)}
        restore(runs)
        log(f"[quality] state between queued runs, {name}: {out[name]}")
    return out


# --- what the README states, checked ---

def dominated_by_ours(theirs: dict, ours: list) -> dict | None:
    match = [p for p in ours if p["rel_l2"]["median"] <= theirs["rel_l2"]["median"]
             and p["block_cost"]["median"] <= theirs["block_cost"]["median"]]
    return min(match, key=lambda p: (p["block_cost"]["median"], p["rel_l2"]["median"]), default=None)


def point_text(p: dict) -> str:
    return f"{p['method']} {p['threshold']:g}" if isinstance(p["threshold"], (int, float)) else \
        f"{p['method']} {p['threshold']}"


def checks(bed: dict) -> list[dict]:
    out = []
    by_steps = {r["steps"]: r for r in bed["step_counts"]}
    name = bed["bed"]["name"]
    for steps in MAIN_STEPS:
        r = by_steps.get(steps)
        if r is None:
            continue
        d = next(p for p in r["points"] if p["method"] == "defaults")
        out.append({"check": f"{name}, {steps} steps: the Cache-DiT node's defaults cost a median relative L2 <= "
                             f"{DEFAULTS_BOUND['rel_l2']} at a block cost <= {DEFAULTS_BOUND['block_cost']}",
                    "value": f"{d['rel_l2']['median']:.4f} at block cost {d['block_cost']['median']:.3f}",
                    "holds": d["rel_l2"]["median"] <= DEFAULTS_BOUND["rel_l2"]
                    and d["block_cost"]["median"] <= DEFAULTS_BOUND["block_cost"]})
        ours = [p for p in r["points"] if p["method"] in OURS and "refused" not in p]
        for theirs in (p for p in r["points"] if p["method"] in ("easycache", "lazycache", "spectrum")):
            if not (theirs["block_cost"]["median"] < 1 and theirs["rel_l2"]["median"] <= 0.1):
                continue
            best = dominated_by_ours(theirs, ours)
            out.append({"check": f"{name}, {steps} steps: a point of ours at no more error and block cost than "
                                 f"{point_text(theirs)} ({theirs['rel_l2']['median']:.4f}, "
                                 f"{theirs['block_cost']['median']:.3f})",
                        "value": "none" if best is None else f"{point_text(best)} ({best['rel_l2']['median']:.4f}, "
                                                             f"{best['block_cost']['median']:.3f})",
                        "holds": best is not None})
        out += band_checks(name, steps, r["points"])
        budgets = [p for p in r["points"] if p["method"] == "budget"]
        below = [p for p in budgets if p["threshold"] in (REFUSED_BUDGET, QUICK_REFUSED_BUDGET)]
        if below:
            p = below[0]
            out.append({"check": f"{name}, {steps} steps: budget {p['threshold']:g} (below any cached step) refused "
                                 "naming error_budget", "value": p.get("refused", "not refused")[:100],
                        "holds": p.get("refused_input") == "error_budget"})
        met = [p for p in budgets if p not in below and "refused" not in p]
        for p in (p for p in budgets if p not in below):
            if "refused" in p:
                out.append({"check": f"{name}, {steps} steps: budget {p['threshold']:g} met",
                            "value": p["refused"][:100], "holds": False})
                continue
            out.append({"check": f"{name}, {steps} steps: budget {p['threshold']:g} met (median of the cases), its "
                                 f"calibration at most {MAX_BUDGET_WORK:g} full runs of work",
                        "value": f"{p['rel_l2']['median']:.4f} at block cost {p['block_cost']['median']:.3f}; "
                                 f"calibration {p['work_in_full_runs']:.2f} full runs",
                        "holds": p["rel_l2"]["median"] <= p["threshold"] and p["work_in_full_runs"] <= MAX_BUDGET_WORK})
        if len(met) >= 2:
            costs = [p["block_cost"]["median"] for p in sorted(met, key=lambda p: p["threshold"])]
            out.append({"check": f"{name}, {steps} steps: block cost falls as the budget grows",
                        "value": " > ".join(f"{c:.3f}" for c in costs),
                        "holds": all(a >= b for a, b in zip(costs, costs[1:])) and costs[0] > costs[-1]})
    return out


def in_band(p: dict) -> bool | None:
    """Whether an error-criterion point means its target: its median error within BAND x the target and x its
    median estimate; None for a point that caches nothing (a target below the smallest step: a right answer)."""
    if p["block_cost"]["median"] >= 1 or "estimate" not in p:
        return None
    measured, estimate = p["rel_l2"]["median"], p["estimate"]["median"]
    return BAND[0] <= measured / p["threshold"] <= BAND[1] and estimate > 0 and \
        BAND[0] <= measured / estimate <= BAND[1]


def band_checks(name: str, steps: int, points: list) -> list[dict]:
    """Item by item, the error criterion's targets 0.01 to 0.05 (plain and with TaylorSeer) in the band."""
    out = []
    for method in ("ours_error", "ours_taylorseer"):
        swept = sorted((p for p in points if p["method"] == method
                        and BAND_TARGETS[0] <= p["threshold"] <= BAND_TARGETS[1]), key=lambda p: p["threshold"])
        judged = [(p, in_band(p)) for p in swept]
        if not judged:
            continue
        value = "; ".join(f"{p['threshold']:g}: " + ("caches nothing" if ok is None else
                                                      f"{p['rel_l2']['median'] / p['threshold']:.2f} x target, "
                                                      f"{p['rel_l2']['median'] / p['estimate']['median']:.2f} x "
                                                      "estimate") for p, ok in judged)
        out.append({"check": f"{name}, {steps} steps: {LABELS[method]}, targets {BAND_TARGETS[0]:g} to "
                             f"{BAND_TARGETS[1]:g}: measured median error within {BAND[0]:g} to {BAND[1]:g} x the "
                             "target and x the estimate",
                    "value": value, "holds": all(ok is not False for _p, ok in judged)})
    return out


def band_table(bed: dict) -> str:
    """Target, the nodes' estimate and the measured error of every error-criterion point and the defaults."""
    lines = ["| steps | method | target | estimate median [min, max] | measured median [min, max] | measured / "
             "target | measured / estimate |", "|---|---|---|---|---|---|---|"]
    for r in bed["step_counts"]:
        for p in r["points"]:
            if p["method"] not in ("ours_error", "ours_taylorseer", "defaults") or "estimate" not in p:
                continue
            e, m = p["estimate"], p["rel_l2"]
            ratio = f"{m['median'] / e['median']:.2f}" if e["median"] > 0 else "-"
            lines.append(f"| {r['steps']} | {LABELS[p['method']]} | {p['threshold']:g} | {e['median']:.4f} "
                         f"[{e['min']:.4f}, {e['max']:.4f}] | {m['median']:.4f} [{m['min']:.4f}, {m['max']:.4f}] | "
                         f"{m['median'] / p['threshold']:.2f} | {ratio} |")
    return "\n".join(lines)


# --- the constants the tuning bed chooses ---

def propagations(tuning: dict) -> list[tuple[float, float]]:
    """(sigma, measured error / (sigma gap x the cache's miss)) of every step cached alone: how far the final latent
    carries a step's error, as a share of what the criterion measures of it in the run."""
    out = []
    for table in tuning["single_steps"]:
        sigmas = table["sigmas"]
        for case in table["cases"]:
            for j, skip in case["skips"].items():
                miss = case.get("misses", {}).get(str(j))
                j = int(j)
                if miss and skip > 0:
                    out.append((sigmas[j], skip / (miss * (sigmas[j] - sigmas[j + 1]))))
    return out


def choose(tuning: dict) -> dict:
    """What the tuning bed chooses: the default error target: the largest swept
    target whose median error stays within CHOICE_MARGIN of the defaults' bound at 20 and at 40 steps. Only the
    tuning bed may choose. Beside it, for the record, what its single steps say of the criterion's propagation
    (the median of `propagations` below its band and above it), which the pack's design values do not follow
    (docs/quality.md: they calibrate single steps, not the cached runs)."""
    if tuning["bed"]["role"] != "tuning":
        raise ValueError(f"bed {tuning['bed']['name']!r} is held out: only the tuning bed chooses the defaults")
    from devtools.paths import import_pack

    import_pack()
    from wan22_cachedit.nodes.core.cache import PROPAGATION_BAND

    ratios = propagations(tuning)
    low = [r for s, r in ratios if s <= PROPAGATION_BAND[0]]
    high = [r for s, r in ratios if s >= PROPAGATION_BAND[1]]
    bound = DEFAULTS_BOUND["rel_l2"] * CHOICE_MARGIN
    by_steps = {r["steps"]: r for r in tuning["step_counts"]}
    errors = {s: {p["threshold"]: p["rel_l2"]["median"] for p in by_steps[s]["points"]
                  if p["method"] == "ours_error"} for s in MAIN_STEPS}  # a target the results lack: not chosen
    fits = [t for t in TARGETS if all(errors[s].get(t, math.inf) <= bound for s in MAIN_STEPS)]
    # the budget's first TaylorSeer target: TaylorSeer's error over the plain criterion's at the same target
    taylorseer = [p["rel_l2"]["median"] / errors[s][p["threshold"]] for s in MAIN_STEPS
                  for p in by_steps[s]["points"] if p["method"] == "ours_taylorseer" and errors[s].get(p["threshold"])]
    return {"error_target": max(fits) if fits else None,
            "taylorseer_error": round(statistics.median(taylorseer), 2) if taylorseer else None,
            "single_step_propagation": {"low": round(statistics.median(low), 2) if low else None,
                                        "high": round(statistics.median(high), 2) if high else None}}


def pack_constants() -> dict:
    from devtools.paths import import_pack

    import_pack()
    from wan22_cachedit.nodes.core import budget, cache

    return {"error_target": cache.CachePlan().error_target, "taylorseer_error": budget.TAYLORSEER_ERROR}


# --- writing ---

def table(bed: dict) -> str:
    lines = ["| steps | split | method | parameter | rel. L2 median [min, max] | PSNR dB | block cost | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for r in bed["step_counts"]:
        split = "/".join(map(str, r["split"]))
        lines.append(f"| {r['steps']} | {split} | native ({r['native_median_s']:.2f} s) | - | 0 | - | 1.000 | 1.00x |")
        for p in r["points"]:
            label = LABELS[p["method"]]
            parameter = p["threshold"] if isinstance(p["threshold"], str) else f"{p['threshold']:g}"
            if "refused" in p:
                lines.append(f"| {r['steps']} | {split} | {label} | {parameter} | refused: {p['refused'][:90]} | - "
                             "| - | - |")
                continue
            e, c = p["rel_l2"], p["block_cost"]
            psnr = f"{p['psnr_db']['median']:.1f}" if "psnr_db" in p else "-"
            speed = f"{p['speedup']:.2f}x" if "speedup" in p else "-"
            extra = "" if "error_target" not in p else (f" (target {p['error_target']:.4g}, calibration "
                                                        f"{p['work_in_full_runs']:.2f} full runs)")
            lines.append(f"| {r['steps']} | {split} | {label}{extra} | {parameter} | {e['median']:.4f} "
                         f"[{e['min']:.4f}, {e['max']:.4f}] | {psnr} | {c['median']:.3f} | {speed} |")
    return "\n".join(lines)


def chart(bed: dict, path: str) -> None:
    results = [r for r in bed["step_counts"] if r["steps"] in MAIN_STEPS] or bed["step_counts"]
    fig, axes = plot_grid(len(results), 5.4, 4.4)
    for ax, r in zip(axes.flat, results):
        for method, label in LABELS.items():
            pts = [p for p in r["points"] if p["method"] == method and "refused" not in p]
            if method == "spectrum":
                for p in pts:
                    ax.plot([max(p["rel_l2"]["median"], FLOOR)], [p["block_cost"]["median"]], marker="D",
                            markersize=5, color=COLOURS[method], linestyle="none", label=label)
                continue
            pts = sorted(pts, key=lambda p: p["threshold"])
            if pts:
                ax.plot([max(p["rel_l2"]["median"], FLOOR) for p in pts], [p["block_cost"]["median"] for p in pts],
                        marker="*" if method == "defaults" else "s" if method == "budget" else "o",
                        markersize=12 if method == "defaults" else 4, color=COLOURS[method], label=label,
                        linestyle="none" if method == "defaults" else ":" if method == "budget" else "-")
        ax.axvline(DEFAULTS_BOUND["rel_l2"], color="#888888", linewidth=0.7, linestyle="--")
        ax.axhline(DEFAULTS_BOUND["block_cost"], color="#888888", linewidth=0.7, linestyle="--")
        ax.set_xscale("log")
        ax.set_title(f"{bed['bed']['name']} ({bed['bed']['role']}): {r['steps']} steps {r['sampler']}, shift "
                     f"{r['flow_shift']:g}, split {r['split'][0]}/{r['split'][1]}", fontsize=9)
        ax.set_xlabel(f"median relative L2 to the uncached latent ({len(CASES)} seeds x classes)", fontsize=8)
        ax.set_ylabel("block forwards, share of uncached", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    finish_grid(fig, axes, len(results), f"Caches on the {bed['bed']['name']} bed: block cost against error", path)


def bed_line(bed: dict) -> str:
    gen, losses, config = bed["generation"], bed["losses"], bed["config"]
    sizes = ", ".join(f"{f}x{s}x{s}" for f, s in config["sizes"])
    return (f"Bed `{bed['name']}` ({bed['role']}, key `{bed['key']}`): {config['num_layers']} layers, "
            f"{config['dim'] // 128} heads, ffn {config['ffn_dim']}, shapes {', '.join(config['shapes'])}, "
            f"motions {', '.join(config['directions'])}, texture {config['texture']:g}, pan {config['pan']}, "
            f"latent sizes {sizes}; trained {bed['training_wall_s']:.0f} s (steps high {losses['high']['steps']}, "
            f"low {losses['low']['steps']}); validation loss high {losses['high']['first_validation']:.3f} -> "
            f"{losses['high']['best_validation']:.3f}, low {losses['low']['first_validation']:.3f} -> "
            f"{losses['low']['best_validation']:.3f}; samples fit a template at {gen['template_fit_mean']:.3f} "
            f"(clean data {gen['clean_data_fit_mean']:.3f}, noise 1.0), class right in {gen['class_right']} of "
            f"{gen['of']} at CFG 4; SHA-256 high {bed['sha256']['high'][:12]}, low {bed['sha256']['low'][:12]}.")


def yes_no(equal: bool, distance: float) -> str:
    return "yes (bit for bit)" if equal else f"no (relative L2 {distance:.4f})"


def check_table(held: list) -> str:
    return "\n".join(["| check | measured | holds |", "|---|---|---|"] +
                     [f"| {c['check']} | {c['value']} | {'yes' if c['holds'] else 'NO'} |" for c in held])


def write_bed(name: str, bed: dict, folder: str) -> None:
    """{folder}/{name}.json, .md (the bed, the table, the checks, the extra tables) and .png; printed too."""
    bed["checks"] = held = checks(bed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(bed, f, indent=1, default=str)
    extra = ""
    if bed.get("state"):
        rows = [f"| {peer} | {yes_no(s['queued_again_equals_first'], s['queued_again_rel_l2'])} | "
                f"{yes_no(s['uncached_after_equals_before'], s['uncached_after_rel_l2'])} |"
                for peer, s in bed["state"].items()]
        extra += ("\nState between queued runs (seed A, seed B, then seed A again on the same patched MODELs; then "
                  "an uncached run of seed A):\n\n| peer | A again = A | uncached after = uncached before |\n"
                  "|---|---|---|\n" + "\n".join(rows) + "\n")
    if any("estimate" in p for r in bed["step_counts"] for p in r["points"]):
        extra += ("\nThe error criterion's targets, its own estimates (the nodes' report) and the measured errors "
                  f"({bed['bed']['role']} bed):\n\n{band_table(bed)}\n")
    if bed.get("choice"):
        extra += f"\nChosen on this bed (bench.quality --choose): `{json.dumps(bed['choice'])}`\n"
    with open(os.path.join(folder, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(f"# Quality on the `{bed['bed']['name']}` bed ({bed['bed']['role']}, cpu)\n\n{bed_line(bed['bed'])}"
                f"\n\n{table(bed)}\n\n{check_table(held)}\n{extra}\n{bed.get('note', '')}Plot: `{name}.png`. "
                f"Config: `{json.dumps(bed['config'])}`\n")
    chart(bed, os.path.join(folder, f"{name}.png"))
    print(bed_line(bed["bed"]))
    print(table(bed))
    print(check_table(held))
    print(f"[quality] written: {os.path.join(folder, name)}.json, .md, .png")


def write_summary(beds: dict, folder: str, name: str) -> None:
    """{folder}/{name}.md: each bed's line, its defaults and budgets at 20 and 40 steps, every check."""
    lines = ["# Quality on the trained test beds (cpu)", "",
             "One bed (`tuning`) chooses every default; the others are held out. Each bed's full table and plot: "
             "`quality_<bed>.md`, `.png`.", ""]
    for bed in beds.values():
        if not any("estimate" in p for r in bed["step_counts"] for p in r["points"]):  # kept from before it
            lines += ["(Measured with the error criterion as it stood before 2026-12-07, a gain fitted on the "
                      "tuning bed in place of the measured miss.)", ""]
        lines += [bed_line(bed["bed"]), "", "| steps | defaults (error, block cost) | budget 0.03 | budget 0.05 |",
                  "|---|---|---|---|"]
        for r in bed["step_counts"]:
            if r["steps"] not in MAIN_STEPS:
                continue
            cells = []
            for method, parameter in (("defaults", None), ("budget", 0.03), ("budget", 0.05)):
                p = next((p for p in r["points"] if p["method"] == method
                          and (parameter is None or p["threshold"] == parameter)), None)
                cells.append("-" if p is None else "refused" if "refused" in p else
                             f"{p['rel_l2']['median']:.4f}, {p['block_cost']['median']:.3f}")
            lines.append(f"| {r['steps']} | " + " | ".join(cells) + " |")
        lines.append("")
    held = [c for bed in beds.values() for c in bed["checks"]]
    lines += [check_table(held), "",
              f"Every check holds: {'yes' if all(c['holds'] for c in held) else 'NO'}.", ""]
    with open(os.path.join(folder, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


# --- the runs ---

def measure_bed(name: str, steps: list, quick: bool, log=print, budgets_only: bool = False) -> dict:
    """One bed's measurements at `steps` in this process (its ComfyUI, its experts loaded once); `budgets_only`:
    the budget points alone."""
    from devtools import testbed
    from devtools.bed_runs import BedRuns

    bed = testbed.build(name)  # once per machine: from the cache after the first time
    runs = BedRuns(tempfile.mkdtemp(prefix="wan22-quality-"), bed, testbed.World(bed.config))
    counter, methods = BlockCounter(runs.models), Methods(runs.comfy)
    runs.run({**LORA_RUN, "steps": 4}, 1, 0)  # untimed: first calls
    out = {"step_counts": []}
    for s in steps:
        begun = time.perf_counter()
        if budgets_only:
            points = measure_budgets(runs, counter, {**RUNS[s], "steps": s}, quick, log)
            out["step_counts"].append({"steps": s, "points": points})
        else:
            out["step_counts"].append(measure_steps(runs, counter, methods, s, quick, log))
        log(f"[quality] {name}, {s} steps in {time.perf_counter() - begun:.0f} s")
    if bed.role in ("tuning", "quick") and any(s in MAIN_STEPS for s in steps) and not budgets_only:
        out["single_steps"] = [measure_single_steps(runs, s, quick, log) for s in steps if s in MAIN_STEPS]
        out["state"] = measure_state(runs, methods, log)
    restore(runs)
    return out


def restore(runs) -> None:
    """The bed's experts as they were loaded: what Spectrum leaves on the shared models taken off."""
    if spectrum_missing() is None:
        for model in runs.models.values():
            spectrum_restore(model)


def bed_summary(bed) -> dict:
    summary = {k: bed.log[k] for k in ("key", "name", "role", "config", "training_wall_s", "sha256", "generation")}
    summary["losses"] = {role: {k: t[k] for k in ("first_validation", "best_validation", "best_step", "steps",
                                                   "stopped", "seconds")}
                         for role, t in bed.log["training"].items()}
    return summary


def in_parts(units: list, args) -> list:
    """(bed, steps) units measured by `args.jobs` child processes of one thread each, the longest first."""
    groups = [units[i::args.jobs] for i in range(args.jobs)]
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

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bed", nargs="+", choices=list(testbed.BEDS), help="beds (default: all)")
    parser.add_argument("--steps", type=int, nargs="+", choices=list(RUNS), help="step counts (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="processes of one thread each")
    parser.add_argument("--choose", action="store_true",
                        help="print the constants the tuning bed's last results choose, beside the pack's")
    parser.add_argument("--budgets", action="store_true",
                        help="measure the error budgets' points only (20 and 40 steps), into the kept results of "
                             "the same weights (a change to the budget needs minutes, not the whole benchmark)")
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
    units.sort(key=lambda u: -u[1][0] * testbed.config_of(u[0]).num_layers * math.prod(testbed.config_of(u[0]).measured))  # noqa: E501
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
    if args.budgets:  # the summary keeps the beds not measured again as they were
        for name in ([] if args.quick else testbed.BEDS):
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
