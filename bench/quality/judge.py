"""Judging a bed's results: the checks of what the README states (the defaults, the budgets, the peers, the error
criterion's band), and what the tuning bed chooses. Pure: each takes a result dictionary (measure.py's) and
returns verdicts; tests/core/test_quality_judge.py feeds them small ones."""

from __future__ import annotations

import math
import statistics

from bench.quality.settings import (BAND, BAND_TARGETS, CHOICE_MARGIN, DEFAULTS_BOUND, FRONTIER, FRONTIER_ERROR,
                                    LABELS, MAIN_STEPS, MAX_BUDGET_WORK, OURS, PEERS, QUICK_REFUSED_BUDGET,
                                    REFUSED_BUDGET, TARGETS)


def dominated_by_ours(theirs: dict, ours: list) -> dict | None:
    match = [p for p in ours if p["rel_l2"]["median"] <= theirs["rel_l2"]["median"]
             and p["block_cost"]["median"] <= theirs["block_cost"]["median"]]
    return min(match, key=lambda p: (p["block_cost"]["median"], p["rel_l2"]["median"]), default=None)

def our_points(points: list) -> list:
    """The points of ours a peer is judged against: every setting and budget of ours that ran (not refused)."""
    return [p for p in points if p["method"] in OURS and "refused" not in p]

def judged_peers(points: list) -> list:
    """The peers' points the peer check judges: those that skip something at a median error of 0.1 or less."""
    return [p for p in points if p["method"] in PEERS and p["block_cost"]["median"] < 1
            and p["rel_l2"]["median"] <= 0.1]

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
        ours = our_points(r["points"])
        for theirs in judged_peers(r["points"]):
            best = dominated_by_ours(theirs, ours)
            out.append({"check": f"{name}, {steps} steps: a point of ours at no more error and block cost than "
                                 f"{point_text(theirs)} ({theirs['rel_l2']['median']:.4f}, "
                                 f"{theirs['block_cost']['median']:.3f})",
                        "value": "none" if best is None else f"{point_text(best)} ({best['rel_l2']['median']:.4f}, "
                                                             f"{best['block_cost']['median']:.3f})",
                        "holds": best is not None})
        out += band_checks(name, steps, r["points"])
        if steps in FRONTIER:
            out.append(frontier_check(name, steps, ours))
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

def frontier_best(ours: list) -> dict | None:
    """The point of ours that ran the fewest blocks at a median error of FRONTIER_ERROR or less."""
    within = [p for p in ours if p["rel_l2"]["median"] <= FRONTIER_ERROR]
    return min(within, key=lambda p: (p["block_cost"]["median"], p["rel_l2"]["median"]), default=None)

def frontier_check(name: str, steps: int, ours: list) -> dict:
    """The fewest blocks any point of ours ran at a median error of FRONTIER_ERROR or less, against FRONTIER."""
    best = frontier_best(ours)
    return {"check": f"{name}, {steps} steps: the frontier: at a median error <= {FRONTIER_ERROR:g}, "
                     f"at most {FRONTIER[steps]:g} of the blocks run (our best point)",
            "value": "none" if best is None else f"{point_text(best)} ({best['rel_l2']['median']:.4f}, "
                                                 f"{best['block_cost']['median']:.3f})",
            "holds": best is not None and best["block_cost"]["median"] <= FRONTIER[steps]}

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
        swept = sorted((p for p in points if p["method"] == method and "estimate" in p  # (none before the estimate)
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
    tuning bed may choose. Beside it, TaylorSeer's error over the plain criterion's (the budget's first TaylorSeer
    target) and what the single steps say of the criterion's propagation (the median of `propagations` below its
    band and above it), which the pack's propagation is RUN_OVER_SINGLE times (docs/quality.md)."""
    if tuning["bed"]["name"] != "tuning":
        raise ValueError(f"bed {tuning['bed']['name']!r} is not `tuning`: only the tuning bed chooses the defaults")
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

    return {"error_target": cache.CachePlan().error_target, "taylorseer_error": budget.TAYLORSEER_ERROR,
            "single_step_propagation": cache.SINGLE_STEP_PROPAGATION}
