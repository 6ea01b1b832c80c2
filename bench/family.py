"""The Wan2.2 family on its trained beds: VACE-Fun's control under the cache, and the two ways to treat its hints.

On the VACE bed (devtools/testbed.py, FAMILY["vace"]: a trained VACE-Fun pair that puts the object where its
control, the object's track, puts it), the official template's graph of ComfyUI's own nodes with WanVaceToVideo's
conditioning (bed_runs.vace_conditioning): per expert MODEL -> [Wan2.2 Cache-DiT (MODEL)] -> ModelSamplingSD3 ->
KSamplerAdvanced, at 20 steps (uni_pc, shift 8) and 40 (euler, shift 5), CFG 4 / 3, for each of CASES (a seed, a
class, and the start the control puts the object at):

- native: no cache node (the reference of its case);
- the Cache-DiT MODEL node at its defaults, and at error target AGGRESSIVE (where it skips more), each with the
  VACE hints of cached steps "fresh" (computed, their change added: the pack's) and "cached" (left inside the
  cached residual, a step or more old), nodes/vace_hints.py.

Error: relative L2 of the final latent against native's (the median over the cases). Block cost: the main and
VACE blocks run, counted by forward hooks, as a share of native's. Control fidelity: testbed.World.track_fidelity
of the output (1: the object on the control's track; 0: no closer than chance), the mean over the cases, against
native's. The check: at the defaults, the pack's design keeps at least 0.9 of native's fidelity.

Writes bench/results/family.{json,md}; --quick is a smoke test on a quick VACE bed (family_quick.*, its figures
claim nothing).

    .venv/bin/python -m bench.family [--steps 20 40] [--quick]
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
AGGRESSIVE = 0.1  # an error target where the cache skips more than at the defaults
DESIGNS = ("fresh", "cached")
CHOSEN = "fresh"  # the pack's (StageCache.vace_hints)
KEEP = 0.9  # the share of native's control fidelity the pack's design keeps at the defaults


class VaceCounter:
    """The VACE blocks that run, by forward hooks on both experts' VACE blocks."""

    def __init__(self, models: dict):
        self.count = 0
        for model in models.values():
            for block in model.model.diffusion_model.vace_blocks:
                block.register_forward_hook(self.hook)

    def hook(self, _module, _args, _output):
        self.count += 1


def points(runs, methods) -> dict:
    """name -> (design, target, patch) for the cached points."""
    defaults = runs.comfy.pack("nodes.core.cache").CachePlan().node_inputs()
    out = {}
    for target, label in ((defaults["error_target"], "defaults"), (AGGRESSIVE, f"target {AGGRESSIVE:g}")):
        node = {"criterion": "error", "error_target": target}
        for design in DESIGNS:
            out[f"{label}, {design}"] = (design, label, methods.ours(defaults["residual_diff_threshold"], node, {}))
    return out


def measure_steps(runs, counters: tuple, steps: int, quick: bool, log) -> dict:
    from devtools import testbed

    run = {**RUNS[steps], "steps": steps}
    world, size = runs.world, runs.bed.config.measured
    stage_cache = runs.comfy.pack("nodes.stage_cache").StageCache
    main, vace = counters
    named = points(runs, Methods(runs.comfy))
    rows = {name: {"rel_l2": [], "cost": [], "fidelity": []} for name in ("native", *named)}
    for i, (seed, cls) in enumerate(CASES[:1] if quick else CASES):
        cls %= len(world.classes)
        start = testbed.control_start(world, i, cls, size)
        control = world.control(cls, *start, *size)
        native = None
        for name in ("native", *named):
            design, _label, patch = named.get(name, (stage_cache.vace_hints, None, None))
            stage_cache.vace_hints = design
            main.count = vace.count = 0
            try:
                latent = runs.run(run, seed, cls, patch, control=control)
            finally:
                stage_cache.vace_hints = CHOSEN
            blocks = main.count + vace.count
            if native is None:
                native, native_blocks = latent, blocks
            fit = world.fit(runs.model_space(latent)[0])
            row = rows[name]
            row["rel_l2"].append(rel_l2(native, latent))
            row["cost"].append(blocks / native_blocks)
            row["fidelity"].append(world.track_fidelity(fit, cls, start, *size)["fidelity"])
        log(f"[family] vace, {steps} steps, seed {seed} class {cls}: {len(rows)} points")
    return {"steps": steps, **run, "split": list(runs.schedule(run).split),
            "points": [{"name": name, "design": named[name][0] if name in named else None,
                        "setting": named[name][1] if name in named else None,
                        "rel_l2": statistics.median(r["rel_l2"]), "block_cost": statistics.median(r["cost"]),
                        "fidelity": statistics.mean(r["fidelity"]), "per_case": r} for name, r in rows.items()]}


def checks(step_counts: list) -> list:
    out = []
    for counts in step_counts:
        by_name = {p["name"]: p for p in counts["points"]}
        native, chosen = by_name["native"]["fidelity"], by_name[f"defaults, {CHOSEN}"]
        out.append({"check": f"{counts['steps']} steps: the defaults ({CHOSEN} hints) keep at least {KEEP:g} of "
                             "native's control fidelity",
                    "holds": chosen["fidelity"] >= KEEP * native,
                    "measured": f"{chosen['fidelity']:.3f} against native's {native:.3f}"})
    return out


def table(results: dict) -> str:
    lines = ["| steps | point | median rel. L2 | block cost | control fidelity (mean) |", "|---|---|---|---|---|"]
    for counts in results["step_counts"]:
        for p in counts["points"]:
            lines.append(f"| {counts['steps']} | {p['name']} | {p['rel_l2']:.4f} | {p['block_cost']:.3f} | "
                         f"{p['fidelity']:.3f} |")
    if results["checks"]:  # none in a smoke test: it judges no target
        lines += ["", "| check | holds | measured |", "|---|---|---|"]
        lines += [f"| {c['check']} | {'yes' if c['holds'] else 'no'} | {c['measured']} |" for c in results["checks"]]
    generation = results["bed"]["generation"]
    lines += ["", f"The bed ({results['bed']['name']}, key {results['bed']['key']}): samples fit a template at "
                  f"{generation['template_fit_mean']:.3f} (mean), class right in {generation['class_right']} of "
                  f"{generation['of']}, the control's track followed at {generation['fidelity_mean']:.3f} "
                  "(native, uni_pc 20 steps, CFG 4)."]
    return "\n".join(lines)


def main() -> int:
    from devtools import testbed
    from devtools.bed_runs import BedRuns

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", choices=(20, 40), default=[20, 40])
    add_output_arguments(parser, "a smoke test on a quick VACE bed at 20 steps (family_quick*)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.WARNING)
    started = time.perf_counter()
    bed = testbed.build("quick_vace" if args.quick else "vace")
    runs = BedRuns(tempfile.mkdtemp(prefix="wan22-family-"), bed, testbed.World(bed.config))
    counters = BlockCounter(runs.models), VaceCounter(runs.models)
    step_counts = [measure_steps(runs, counters, s, args.quick, print) for s in ([20] if args.quick else args.steps)]
    results = {"bed": {k: bed.log[k] for k in ("key", "name", "role", "config", "training_wall_s", "sha256",
                                                 "generation")},
               "step_counts": step_counts, "checks": [] if args.quick else checks(step_counts),
               "config": {"cases": CASES, "aggressive_target": AGGRESSIVE, "chosen": CHOSEN, "quick": args.quick,
                          "threads": 1, "torch": torch.__version__}}
    write_results("family_quick" if args.quick else "family", "The Wan2.2 family on its trained beds: VACE-Fun",
                  table(results), results, QUICK_NOTE if args.quick else "", args.results_dir)
    print(f"[family] {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    raise SystemExit(main())
