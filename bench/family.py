"""The Wan2.2 family on its trained beds: VACE-Fun's control under the cache (the two ways to treat its hints), and
TI2V-5B's error at the defaults.

On the VACE bed (devtools/testbed/, FAMILY["vace"]: a trained VACE-Fun pair that puts the object where its
control, the object's track, puts it), the official template's graph of ComfyUI's own nodes with WanVaceToVideo's
conditioning (bed_runs.vace_conditioning): per expert MODEL -> [Wan2.2 Cache-DiT (MODEL)] -> ModelSamplingSD3 ->
KSamplerAdvanced, at 20 steps (uni_pc, shift 8) and 40 (euler, shift 5), CFG 4 / 3, for each of CASES (a seed, a
class, and the start the control puts the object at):

- native: no cache node (the reference of its case);
- the Cache-DiT MODEL node at its defaults, over the error targets TARGETS, and with cache-dit's TaylorSeer
  calibrator (its forecast of the cached residual extrapolates the hints inside it too), each with the
  VACE hints of cached steps "fresh" (computed, their change added: the pack's) and "cached" (left inside the
  cached residual, a step or more old), nodes/vace_hints.py.

Error: relative L2 of the final latent against native's (the median over the cases). Block cost: the main and
VACE blocks run, counted by forward hooks, as a share of native's; the bed's VACE blocks are a third of its
blocks, VACE-Fun A14B's a sixth (8 beside 40), so the A14B-weighted cost weighs the main and VACE blocks' shares
as there (A14B_SHARES). Control fidelity: how far the object in the
output is from where the control puts it, frame by frame, to a fraction of a latent pixel (`track`: the
object's centre in each frame, after the background's least-squares fit is taken off, against the control
track's), as 1 - distance / the distance of two random tracks of the class (1: on the track; 0: no closer than
chance), the mean over the cases, against native's. The check: at the defaults, the pack's design keeps at least
0.9 of native's fidelity; and which design's points the other's do not dominate (a point dominates another with
no more median error and no more median block cost): the measurement the choice of design stands on.

On the TI2V-5B bed (FAMILY["ti2v"]: one 48-channel transformer), the 5B template's graph (one KSampler, CFG 4)
for the same cases without a control: native, and the Cache-DiT MODEL node at its defaults: error and block
cost, as above.

Writes bench/results/family.{json,md}; --quick is a smoke test on quick beds (family_quick.*, its figures claim
nothing).

    .venv/bin/python -m bench.family [--bed vace ti2v] [--steps 20 40] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time

import torch

from bench.common import QUICK_NOTE, ROOT, add_output_arguments, write_results
from bench.few_steps import BlockCounter, Methods
from bench.quality import RUNS
from bench.run import rel_l2

CASES = [(101, 1), (202, 4), (303, 6)]  # (seed, class); the control's start follows from them (testbed)
TARGETS = (0.005, 0.0125, 0.025, 0.05, 0.1)  # error targets swept with each design (the default among them)
DESIGNS = ("fresh", "cached")
CHOSEN = "fresh"  # the pack's (vace_hints.for_stage, unless a MODEL asks otherwise)
A14B_SHARES = (40 / 48, 8 / 48)  # VACE-Fun A14B's main and VACE blocks, as shares of all its blocks
KINDS = ("vace", "ti2v")  # the family's beds (devtools/testbed/ FAMILY)
KEEP = 0.9  # the share of native's control fidelity the pack's design keeps at the defaults


def centres(world, latent: torch.Tensor) -> torch.Tensor:
    """The object's centre (y, x) in each frame of a latent (C, F, H, W) in the space the transformer sees: the
    latent less its least-squares background (the world's background planes), projected on the object's channel
    direction; the centre of its positive part. (F, 2)."""
    frames, side = latent.shape[1], latent.shape[3]
    planes = world.basis(0, *world.starts(0, frames, side)[0], frames, side)[1:]  # the background's: any class
    flat = planes.reshape(len(planes), -1).double()
    coeffs = torch.linalg.lstsq(flat.T, latent.reshape(-1).double()).solution
    rest = latent.double() - (coeffs @ flat).reshape(latent.shape)
    vector = world.object_vector.double()
    weight = torch.einsum("cfhw,c->fhw", rest, vector / vector.dot(vector)).clamp(min=0)
    ys, xs = (g.double() for g in world.grid(side))
    total = weight.sum((1, 2)).clamp(min=1e-12)
    return torch.stack([(weight * ys).sum((1, 2)) / total, (weight * xs).sum((1, 2)) / total], dim=1)


def track(world, latent: torch.Tensor, control: torch.Tensor, cls: int) -> dict:
    """How well a latent follows a VACE control (testbed.World.control): the mean distance (latent pixels) of its
    object's centre from the control track's, frame by frame, and the fidelity 1 - distance / chance (the mean
    distance between two starts of the class)."""
    from devtools import testbed

    frames, side = latent.shape[1], latent.shape[3]
    reactive = control[testbed.CHANNELS:2 * testbed.CHANNELS]  # the track alone
    distance = float((centres(world, latent) - centres(world, reactive)).norm(dim=1).mean())
    return {"distance": distance, "fidelity": 1 - distance / world.chance_distance(cls, frames, side)}


def points(runs, methods, quick: bool = False) -> dict:
    """name -> (design, setting, patch) for the cached points: on a VACE bed each design at the defaults, at each of
    TARGETS (the largest alone in the quick mode) and with TaylorSeer; on the 5B bed the MODEL node at its own
    defaults (one KSampler: its sample call is the stage)."""
    if runs.bed.config.single:
        node = methods.node
        inputs = {i.id: i.default for i in node.define_schema().inputs if i.id != "model"}
        return {"defaults": (None, "defaults", lambda _role, model: node.execute(model=model, **inputs).args[0])}
    defaults = runs.comfy.pack("nodes.core.cache").CachePlan().node_inputs()
    out = {}
    targets = TARGETS[-1:] if quick else TARGETS
    settings = [("defaults", {})] + [(f"target {t:g}", {"error_target": t}) for t in targets
                                     if t != defaults["error_target"]]
    for label, node in settings + [("TaylorSeer", {"calibrator": "taylorseer"})]:
        node = {"criterion": "error", "error_target": defaults["error_target"], **node}
        for design in DESIGNS:
            out[f"{label}, {design}"] = (design, label, methods.ours(defaults["residual_diff_threshold"], node, {}))
    return out


def measure_steps(runs, counters: tuple, steps: int, quick: bool, log) -> dict:
    from devtools import testbed

    run = {**RUNS[steps], "steps": steps}
    world, size, vace_bed = runs.world, runs.bed.config.measured, runs.bed.config.vace
    mode_key = runs.comfy.pack("nodes.vace_hints").MODE_KEY
    main, vace = counters
    named = points(runs, Methods(runs.comfy), quick)
    rows = {name: {"rel_l2": [], "cost": [], "a14b_cost": [], "fidelity": []} for name in ("native", *named)}
    for i, (seed, cls) in enumerate(CASES[:1] if quick else CASES):
        cls %= len(world.classes)
        start = testbed.control_start(world, i, cls, size) if vace_bed else None
        control = world.control(cls, *start, *size) if vace_bed else None
        native = None
        for name in ("native", *named):
            design, _label, patch = named.get(name, (None, None, None))
            main.count = 0
            if vace is not None:
                vace.count = 0
            latent = runs.run(run, seed, cls, patch if design is None else with_hints(patch, mode_key, design),
                              control=control)
            blocks = (main.count, vace.count if vace is not None else 0)
            if native is None:
                native, native_blocks = latent, blocks
            row = rows[name]
            row["rel_l2"].append(rel_l2(native, latent))
            row["cost"].append(sum(blocks) / sum(native_blocks))
            if vace_bed:  # as on VACE-Fun A14B, whose VACE blocks are a sixth of its blocks (this bed's: a third)
                row["a14b_cost"].append(sum(share * run / whole for share, run, whole in
                                            zip(A14B_SHARES, blocks, native_blocks)))
            if vace_bed:
                row["fidelity"].append(track(world, runs.model_space(latent)[0], control, cls)["fidelity"])
        log(f"[family] {runs.bed.name}, {steps} steps, seed {seed} class {cls}: {len(rows)} points")
    return {"steps": steps, **run, "split": list(runs.schedule(run).split),
            "points": [{"name": name, "design": named[name][0] if name in named else None,
                        "setting": named[name][1] if name in named else None,
                        "rel_l2": statistics.median(r["rel_l2"]), "block_cost": statistics.median(r["cost"]),
                        "a14b_cost": statistics.median(r["a14b_cost"]) if r["a14b_cost"] else None,
                        "fidelity": statistics.mean(r["fidelity"]) if r["fidelity"] else None, "per_case": r}
                       for name, r in rows.items()]}


def with_hints(patch, key: str, design: str):
    """`patch` (a cache node on each expert), its MODEL then asking the cached stages for `design`'s VACE hints
    (on a clone: the MODEL the patch gave is not changed)."""
    def patched(role, model):
        clone = patch(role, model).clone()
        clone.model_options["transformer_options"][key] = design
        return clone
    return patched


def undominated(points: list, design: str, cost: str = "a14b_cost") -> list:
    """The points of `design` that no point of the other design dominates (by `cost`: the VACE-Fun A14B-weighted
    block cost, or this bed's own)."""
    others = [p for p in points if p["design"] not in (None, design)]
    return [p["name"] for p in points if p["design"] == design and not any(
        o["rel_l2"] <= p["rel_l2"] and o[cost] <= p[cost] for o in others)]


def checks(step_counts: list) -> list:
    """The VACE bed's: at each step count, the defaults keep KEEP of native's control fidelity; and what each design
    has that the other does not dominate."""
    out = []
    for counts in step_counts:
        by_name = {p["name"]: p for p in counts["points"]}
        for design in DESIGNS:
            kept = undominated(counts["points"], design)
            out.append({"check": f"{counts['steps']} steps: {design} hints' points that no point of the other "
                                 "design dominates (A14B-weighted cost)",
                        "holds": bool(kept) if design == CHOSEN else None,
                        "measured": ", ".join(kept) or "none"})
        native, chosen = by_name["native"]["fidelity"], by_name[f"defaults, {CHOSEN}"]
        out.append({"check": f"{counts['steps']} steps: the defaults ({CHOSEN} hints) keep at least {KEEP:g} of "
                             "native's control fidelity",
                    "holds": chosen["fidelity"] >= KEEP * native,
                    "measured": f"{chosen['fidelity']:.3f} against native's {native:.3f}"})
    return out


def table(results: dict) -> str:
    lines = ["| bed | steps | point | median rel. L2 | block cost | A14B-weighted cost | control fidelity (mean) |",
             "|---|---|---|---|---|---|---|"]
    for bed in results["beds"].values():
        for counts in bed["step_counts"]:
            for p in counts["points"]:
                fidelity = "" if p["fidelity"] is None else f"{p['fidelity']:.3f}"
                a14b = "" if p["a14b_cost"] is None else f"{p['a14b_cost']:.3f}"
                lines.append(f"| {bed['bed']['name']} | {counts['steps']} | {p['name']} | {p['rel_l2']:.4f} | "
                             f"{p['block_cost']:.3f} | {a14b} | {fidelity} |")
    if results["checks"]:  # none in a smoke test: it judges no target
        lines += ["", "| check | holds | measured |", "|---|---|---|"]
        lines += [f"| {c['check']} | {'' if c['holds'] is None else 'yes' if c['holds'] else 'no'} | {c['measured']} |"
                  for c in results["checks"]]
    lines.append("")
    for bed in results["beds"].values():
        g, log = bed["bed"]["generation"], bed["bed"]
        follows = f", the control's track followed at {g['fidelity_mean']:.3f}" if "fidelity_mean" in g else ""
        lines.append(f"- The {log['name']} bed (key {log['key']}, trained in {log['training_wall_s']:.0f} s): samples "
                     f"fit a template at {g['template_fit_mean']:.3f} (mean; clean data "
                     f"{g['clean_data_fit_mean']:.3f}), class right in {g['class_right']} of {g['of']}{follows} "
                     "(native, uni_pc 20 steps, CFG 4).")
    return "\n".join(lines)


def measure_bed(name: str, steps: list, quick: bool) -> dict:
    from devtools import testbed
    from devtools.bed_runs import BedRuns

    bed = testbed.build(name)
    runs = BedRuns(tempfile.mkdtemp(prefix="wan22-family-"), bed, testbed.World(bed.config))
    counters = BlockCounter(runs.models), BlockCounter(runs.models, "vace_blocks") if bed.config.vace else None
    return {"bed": {k: bed.log[k] for k in ("key", "name", "role", "config", "training_wall_s", "sha256",
                                            "generation")},
            "step_counts": [measure_steps(runs, counters, s, quick, print) for s in steps]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", choices=(20, 40), default=[20, 40])
    parser.add_argument("--bed", nargs="+", choices=KINDS, default=list(KINDS), help="the family's beds to measure")
    add_output_arguments(parser, "a smoke test on a quick VACE bed at 20 steps (family_quick*)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.WARNING)
    started = time.perf_counter()
    steps = [20] if args.quick else args.steps
    beds = {kind: measure_bed(f"quick_{kind}" if args.quick else kind, steps, args.quick) for kind in args.bed}
    results = {"beds": beds, "checks": [] if args.quick or "vace" not in beds else checks(beds["vace"]["step_counts"]),
               "config": {"cases": CASES, "targets": TARGETS, "chosen": CHOSEN, "quick": args.quick,
                          "threads": 1, "torch": torch.__version__}}
    write_results("family_quick" if args.quick else "family", "The Wan2.2 family on its trained beds",
                  table(results), results, QUICK_NOTE if args.quick else "", args.results_dir)
    print(f"[family] {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    raise SystemExit(main())
