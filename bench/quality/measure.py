"""Measuring one bed: every point on every case at a step count, the budgets, and on the tuning bed the single-step
table and the peers' state between queued runs. Writes nothing; returns result dictionaries (see report.py)."""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from bench.common import Timer
from bench.few_steps import BlockCounter, Methods, round_references, with_natives
from bench.peers import (SPECTRUM_BACKENDS, SPECTRUM_DEFAULTS, spectrum_missing, spectrum_node, spectrum_patch,
                         spectrum_restore)
from bench.quality.settings import (BUDGETS, CALIBRATION, CASES, COMFY, FORECASTS, LORA_RUN, MAIN_STEPS, NATIVE_EVERY,
                                    QUICK_REFUSED_BUDGET, REFUSED_BUDGET, RUNS, SPECTRUM, TARGETS, TAYLORSEER,
                                    THRESHOLDS)
from bench.run import psnr_db, rel_l2


def points(runs, methods: Methods, steps: int, quick: bool) -> dict:
    """name -> (method, parameter, patch(role, MODEL) -> MODEL) for one bed and step count."""
    defaults = runs.comfy.pack("nodes.core.cache").CachePlan().node_inputs()
    out = {}
    error = {"criterion": "error"}
    for t in (TARGETS[1::3] if quick else TARGETS):
        out[f"ours_error@{t:g}"] = ("ours_error", t, methods.ours(defaults["residual_diff_threshold"],
                                                                  {**error, "error_target": t}, {}))
    for calibrator, targets in ([] if quick else [("taylorseer", TAYLORSEER), *FORECASTS.items()]):
        for t in targets:
            out[f"ours_{calibrator}@{t:g}"] = (f"ours_{calibrator}", t, methods.ours(
                defaults["residual_diff_threshold"], {**error, "error_target": t, "calibrator": calibrator}, {}))
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

def estimate_of(models: dict, key: str, combined) -> float | None:
    """What the Cache-DiT MODEL nodes on a run's patched MODELs estimated its error to be: their last sample calls'
    estimates combined (core.cache.combined: in quadrature), None where they report none;
    `key`: their wrappers' (stage_cache.KEY); `combined`: core.cache.combined."""
    import comfy.patcher_extension

    found = []
    for model in models.values():
        for wrapper in model.wrappers.get(comfy.patcher_extension.WrappersMP.SAMPLER_SAMPLE, {}).get(key, []):
            stats = getattr(getattr(wrapper, "__self__", None), "last_statistics", None)
            if stats is not None and stats.get("estimated_error") is not None:
                found.append(stats["estimated_error"])
    return combined(found) if found else None

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
        combined = runs.comfy.pack("nodes.core.cache").combined

        def runner(name, patch):
            def go():
                counter.count = 0
                patched = {}

                def keep(role, model):  # the patched MODELs, whose cache nodes report their estimate
                    patched[role] = patch(role, model)
                    return patched[role]
                out = runs.run(run, seed, cls, None if patch is None else keep)
                blocks[name] = counter.count
                estimates[name] = estimate_of(patched, stage_key, combined)
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
    if bed.name in (testbed.TUNING, "quick") and any(s in MAIN_STEPS for s in steps) and not budgets_only:
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
