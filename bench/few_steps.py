"""Few steps: speed-up against relative L2, as curves, for the cache nodes a ComfyUI graph can take.

Every point is one run of the official Wan2.2 template's graph of ComfyUI's own nodes, per expert
MODEL -> [cache node] -> ModelSamplingSD3 -> KSamplerAdvanced (high: 0 -> switch, leftover noise kept; low:
switch -> end), on the same tiny random experts (bench.run's SPEED_EXPERT: 40 blocks, narrow), loaded once by
ComfyUI's own loader, from the same noise and text. The switch is the split our schedule counts from the
experts' 0.875 boundary (nodes/sigmas.build_schedule). The runs:

- 4, 6 and 8 steps shaped like a LightX2V LoRA run (euler / simple, shift 5, CFG 1 on both experts) and
  20 and 40 steps (uni_pc / simple, shift 12, CFG 4 / 3);
- per step count, the graph without a cache node (native) and, each swept over its threshold:
  Wan2.2 Cache-DiT (MODEL) with the threshold criterion (random experts' residuals move too much for the error
  criterion, the default, to cache anything: this measures speed), at the saved workflows' warm-ups (4 high,
  2 low), at the node's warm-up of 1 on both experts (0 caches the same steps: cache-dit computes the first
  evaluation anyway), and at the saved warm-ups with its caps lifted (max_cached_steps and
  max_continuous_cached_steps -1);
  ComfyUI's EasyCache and LazyCache (start / end percent at their defaults).

Timing is interleaved in rounds (bench.common.interleaved: the order reverses each round), with a native run
before and after every few points, so that each point has native runs next to it in every round; a point's
speed-up is the median over the rounds of the mean of its two neighbouring native times over its own (the
machine is shared, so only ratios taken close together mean anything). The first round runs every point;
after it, the thresholds of a method that ran the same (same blocks run, bit-identical latent: the same
steps cached) are one run, timed as the lowest of them. Each step count gets an equal part of what is left
of the time budget and at least its first round. Relative L2 is of the final latent against the native one;
"blocks saved" counts the transformer blocks run, by forward hooks on the blocks, against the native run.
Torch runs on one thread: two threads on the two cores of a shared machine slow down many times over
whenever another process takes a core. The weights are random: the errors say how far caching moves this
run, not how a real video looks.

Prints a table and writes bench/results/few_steps.{json,md,png}. --quick is a smoke test of the script (a
4-block expert, 16 tokens, 4 and 20 steps, one round, two thresholds per method; its figures claim nothing):
it writes few_steps_quick.* instead.

    .venv/bin/python -m bench.few_steps [--budget-s S] [--repeats N] [--steps 4 8 ...] [--threads 1] [--quick]
                                        [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time

import torch

from bench.common import (QUICK_NOTE, Runs, Timer, add_output_arguments, at_least, finish_grid, interleaved,
                          plot_grid, round_speedups, text_embeddings)
from bench.run import QUICK_EXPERT, SPEED_EXPERT, Bench, rel_l2

LATENT = (1, 16, 1, 16, 16)  # 128x128 pixels, 1 frame: 64 tokens, so that the whole sweep fits in ~15 minutes
# Text positions (the first 24 the prompt's): fewer than umt5's 512, so that the text embedding, which runs outside
# the blocks (so only EasyCache and LazyCache, which skip whole forwards, skip it), stays a small part of a forward,
# as in the real experts.
TEXT_TOKENS = 128
QUICK_LATENT = (1, 16, 1, 8, 8)
LORA_RUN = {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 1.0, "low": 1.0}}
FULL_RUN = {"sampler": "uni_pc", "scheduler": "simple", "flow_shift": 12.0, "cfg": {"high": 4.0, "low": 3.0}}
STEPS = {4: LORA_RUN, 6: LORA_RUN, 8: LORA_RUN, 20: FULL_RUN, 40: FULL_RUN}
QUICK_STEPS = (4, 20)
OURS_THRESHOLDS = [0.08, 0.12, 0.16, 0.24, 0.32, 0.48]
COMFY_THRESHOLDS = [0.05, 0.1, 0.2, 0.3, 0.5]
SEED = 42
NATIVE_EVERY = 5  # a native run before and after each 5 points of a round
FLOOR = 1e-5  # where a relative L2 of 0 (nothing cached) is drawn on the log axis
LABELS = {"ours_defaults": "Wan2.2 Cache-DiT (MODEL), warm-ups 4 / 2 (saved workflows')",
          "ours_warmup1": "Wan2.2 Cache-DiT (MODEL), warmup 1",
          "ours_uncapped": "Wan2.2 Cache-DiT (MODEL), caps lifted",
          "easycache": "ComfyUI EasyCache", "lazycache": "ComfyUI LazyCache"}
COLOURS = {"ours_defaults": "#e88b2c", "ours_warmup1": "#d62728", "ours_uncapped": "#8c564b",
           "easycache": "#2ca02c", "lazycache": "#1f77b4"}


def prompts() -> tuple[list, list]:
    return [[text_embeddings(1, tokens=TEXT_TOKENS), {}]], [[text_embeddings(2, tokens=TEXT_TOKENS), {}]]


class Methods:
    """The MODEL -> MODEL nodes, each as `patch(threshold)` -> a function (role, MODEL) -> MODEL for Runs.native."""

    def __init__(self, comfy):
        import comfy_extras.nodes_easycache as easy

        self.node = comfy.pack("nodes.cache_nodes").Wan22CacheDiTModel
        defaults = comfy.pack("nodes.core.cache").CachePlan().node_inputs()
        self.common = {key: defaults[key] for key in ("first_compute_blocks", "last_compute_blocks",
                                                      "max_continuous_cached_steps", "calibrator")}
        self.experts = {role: {"warmup_steps": defaults[f"{role}_warmup_steps"],
                               "max_cached_steps": defaults[f"{role}_max_cached_steps"]} for role in ("high", "low")}
        self.comfy_nodes = {"easycache": easy.EasyCacheNode, "lazycache": easy.LazyCacheNode}
        self.comfy_defaults = {i.id: i.default for i in easy.EasyCacheNode.define_schema().inputs if i.id != "model"}

    def ours(self, threshold: float, overrides: dict, per_expert: dict):
        def patch(role, model):
            inputs = {**self.common, **self.experts[role], **overrides, **per_expert.get(role, {})}
            return self.node.execute(model=model, enabled=True, residual_diff_threshold=threshold, **inputs).args[0]
        return patch

    def comfy(self, kind: str, threshold: float):
        def patch(_role, model):
            inputs = {**self.comfy_defaults, "reuse_threshold": threshold}
            return self.comfy_nodes[kind].execute(model, **inputs).args[0]
        return patch

    def sweeps(self, quick: bool) -> dict:
        """method -> [(threshold, patch)]."""
        ours = OURS_THRESHOLDS[2::3] if quick else OURS_THRESHOLDS
        theirs = COMFY_THRESHOLDS[1::3] if quick else COMFY_THRESHOLDS
        warmup1 = {role: {"warmup_steps": 1} for role in ("high", "low")}
        saved = {"high": {"warmup_steps": 4}, "low": {"warmup_steps": 2}}
        threshold = {"criterion": "threshold"}
        return {
            "ours_defaults": [(t, self.ours(t, threshold, saved)) for t in ours],
            "ours_warmup1": [(t, self.ours(t, threshold, warmup1)) for t in ours],
            "ours_uncapped": [(t, self.ours(t, {**threshold, "max_cached_steps": -1, "max_continuous_cached_steps": -1},
                                            saved)) for t in ours],
            "easycache": [(t, self.comfy("easycache", t)) for t in theirs],
            "lazycache": [(t, self.comfy("lazycache", t)) for t in theirs],
        }


class BlockCounter:
    """Counts the transformer blocks that run, by forward hooks on both experts' blocks (which cache-dit
    calls one by one when it computes them; a cached step or an EasyCache skip runs none of them); `part`: which
    block list ("vace_blocks": VACE-Fun's VACE blocks)."""

    def __init__(self, models: dict, part: str = "blocks"):
        self.count = 0
        for model in models.values():
            for block in getattr(model.model.diffusion_model, part):
                block.register_forward_hook(self.hook)

    def hook(self, _module, _args, _output):
        self.count += 1

    def counted(self, fn, into: dict, name: str):
        def run():
            self.count = 0
            out = fn()
            into[name] = self.count
            return out
        return run


def with_natives(native, points: dict, every: int) -> tuple[dict, dict]:
    """The runs of one round in order: a native run, `every` points, a native run, ... a native run; and for
    each point the index of the native run just before it (the one after it is the next)."""
    order, before = {}, {}
    for i, (name, run) in enumerate(points.items()):
        if i % every == 0:
            order[f"native#{i // every}"] = native
        order[name], before[name] = run, i // every
    order[f"native#{-(-len(points) // every)}"] = native
    return order, before


def round_references(timed: dict, before: dict) -> dict:
    """Each point's native seconds per round: the mean of its two neighbouring native runs in that round."""
    return {name: [(a + b) / 2 for a, b in zip(timed[f"native#{i}"][2], timed[f"native#{i + 1}"][2])]
            for name, i in before.items()}


def measure_steps(comfy, models, counter, methods: Methods, steps: int, latent: tuple, repeats: int,
                  budget_s: float, quick: bool) -> dict:
    """All points of one step count. The first round runs every point; the thresholds of a method that ran
    the same (same blocks, bit-identical latent) are one run from then on, timed as the lowest of them."""
    config = STEPS[steps]
    runs = Runs(comfy, models, sampler=config["sampler"], scheduler=config["scheduler"], steps=steps,
                flow_shift=config["flow_shift"], seed=SEED, cfg=config["cfg"], latent_shape=latent)
    runs.positive, runs.negative = prompts()
    blocks = {}
    native = runs.native()
    points = {f"{method}@{t:g}": (method, t, runs.native(patch=patch))
              for method, sweep in methods.sweeps(quick).items() for t, patch in sweep}
    counted = {name: counter.counted(run, blocks, name) for name, (_m, _t, run) in points.items()}
    timer = Timer(torch.device("cpu"))
    started = time.perf_counter()
    order, before = with_natives(counter.counted(native, blocks, "native"), counted, NATIVE_EVERY)
    first = interleaved(timer, order, 1)
    first_s = time.perf_counter() - started
    reference, native_blocks = first["native#0"][0], blocks["native"]
    timed_as, seen = {}, {}
    for name, (method, _t, _run) in points.items():
        key = (method, blocks[name], first[name][0].numpy().tobytes())
        timed_as[name] = seen.setdefault(key, name)
    seconds = {name: first[name][2] for name in seen.values()}
    references = {name: refs for name, refs in round_references(first, before).items() if name in seconds}
    natives = [s for name, (_r, _f, times) in first.items() if name.startswith("native") for s in times]
    # a round of the representatives costs about its share of the first round's blocks
    rest = {name: counted[name] for name in seen.values()}
    rest_order, rest_before = with_natives(counter.counted(native, blocks, "native"), rest, NATIVE_EVERY)
    share = sum(blocks[n] for n in rest) + native_blocks * (len(rest_order) - len(rest))
    estimate = first_s * share / (sum(blocks[n] for n in points) + native_blocks * (len(order) - len(points)))
    rounds = 1
    if repeats > 1 and budget_s - first_s >= estimate:
        later = interleaved(timer, dict(reversed(list(rest_order.items()))), repeats - 1, budget_s - first_s)
        for name, refs in round_references(later, rest_before).items():
            seconds[name] = seconds[name] + later[name][2]
            references[name] = references[name] + refs
        natives += [s for name, (_r, _f, times) in later.items() if name.startswith("native") for s in times]
        rounds += len(later["native#0"][2])
    results = []
    for name, (method, threshold, _run) in points.items():
        rep = timed_as[name]
        speedup, ratios = round_speedups(references[rep], seconds[rep])
        results.append({"method": method, "threshold": threshold, "speedup": speedup, "speedups": ratios,
                        "seconds": seconds[rep], "native_seconds": references[rep], "timed_as": rep,
                        "rel_l2": rel_l2(reference, first[name][0]), "blocks": blocks[name],
                        "blocks_saved": 1 - blocks[name] / native_blocks})
    return {"steps": steps, "split": list(runs.schedule.split), **config, "rounds": rounds,
            "runs_per_later_round": len(rest_order), "native_median_s": statistics.median(natives),
            "native_blocks": native_blocks, "points": results}


def measure(step_counts, latent: tuple, repeats: int, budget_s: float, quick: bool) -> list:
    """Each step count gets an equal part of what is left of the budget (a step count that needs less leaves
    the rest to the next ones); each gets its first round whatever the budget."""
    with tempfile.TemporaryDirectory(prefix="wan22-few-steps-") as base:
        bench = Bench(base, "cpu", QUICK_EXPERT if quick else SPEED_EXPERT)
        import comfy.utils

        comfy.utils.set_progress_bar_enabled(False)
        logging.getLogger().setLevel(logging.WARNING)  # the MODEL node's line per sample call, ComfyUI's loads
        models = bench.runs.models
        counter, methods = BlockCounter(models), Methods(bench.comfy)
        warm = Runs(bench.comfy, models, sampler="euler", scheduler="simple", steps=4, flow_shift=5.0, seed=SEED,
                    cfg=LORA_RUN["cfg"], latent_shape=latent)
        warm.positive, warm.negative = prompts()
        for patch in [None] + [points[-1][1] for points in methods.sweeps(True).values()]:
            warm.native(patch=patch)()  # untimed: first calls, cache-dit's import
        started = time.perf_counter()
        results = []
        for i, steps in enumerate(step_counts):
            share = max(0.0, budget_s - (time.perf_counter() - started)) / (len(step_counts) - i)
            begun = time.perf_counter()
            results.append(measure_steps(bench.comfy, models, counter, methods, steps, latent, repeats, share, quick))
            print(f"[few_steps] {steps} steps: {results[-1]['rounds']} rounds in {time.perf_counter() - begun:.0f} s "
                  f"(share {share:.0f} s)", flush=True)
        return results


def rows(results: list) -> list[dict]:
    return [{"steps": r["steps"], "split": "/".join(map(str, r["split"])), **p} for r in results for p in r["points"]]


def table(results: list) -> str:
    lines = ["| steps | split | method | threshold | speed-up | rel. L2 | blocks saved |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['steps']} | {'/'.join(map(str, r['split']))} | native ({r['native_median_s']:.2f} s, "
                     f"{r['rounds']} rounds) | - | 1.00x | 0 | 0% |")
        for p in r["points"]:
            lines.append(f"| {r['steps']} | {'/'.join(map(str, r['split']))} | {LABELS[p['method']]} | "
                         f"{p['threshold']:g} | {p['speedup']:.2f}x | {p['rel_l2']:.4f} | "
                         f"{100 * p['blocks_saved']:.0f}% |")
    return "\n".join(lines)


def chart(results: list, path: str) -> None:
    fig, axes = plot_grid(len(results), 5.2, 4.2)
    for ax, r in zip(axes.flat, results):
        for method, label in LABELS.items():
            points = sorted((p for p in r["points"] if p["method"] == method), key=lambda p: p["threshold"])
            if points:
                ax.plot([max(p["rel_l2"], FLOOR) for p in points], [p["speedup"] for p in points], marker="o",
                        markersize=4, color=COLOURS[method], label=label)
        ax.axhline(1.0, color="#444444", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{r['steps']} steps {r['sampler']}, shift {r['flow_shift']:g}, CFG {r['cfg']['high']:g}/"
                     f"{r['cfg']['low']:g}, split {r['split'][0]}/{r['split'][1]}", fontsize=9)
        ax.set_xlabel(f"relative L2 to the uncached latent (0 drawn at {FLOOR:g})", fontsize=8)
        ax.set_ylabel("speed-up against the uncached graph", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    finish_grid(fig, axes, len(results), "Cache nodes on the native Wan2.2 graph: speed-up against error (random "
                "weights, CPU)", path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=780.0,
                        help="seconds for the timed rounds of all step counts together (each gets its first round)")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="at most this many rounds per step count")
    parser.add_argument("--steps", type=int, nargs="+", choices=list(STEPS), help="step counts (default: all)")
    parser.add_argument("--threads", type=at_least(1), default=1,
                        help="torch threads: 1, because two threads on two shared cores slow down many times over "
                             "whenever another process takes a core")
    add_output_arguments(parser, f"smoke test: a {QUICK_EXPERT['num_layers']}-block expert, latent {QUICK_LATENT}, "
                                 f"steps {QUICK_STEPS}, one round, two thresholds each")
    args = parser.parse_args()
    if args.budget_s < 0:
        parser.error(f"--budget-s {args.budget_s:g}: must be 0 or more")
    latent, step_counts = (QUICK_LATENT, list(QUICK_STEPS)) if args.quick else (LATENT, list(STEPS))
    step_counts = args.steps or step_counts
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    expert = QUICK_EXPERT if args.quick else SPEED_EXPERT
    print(f"[few_steps] experts {expert}, latent {latent}, steps {step_counts}, up to {repeats} rounds, "
          f"budget {args.budget_s:.0f} s, {torch.get_num_threads()} threads", flush=True)
    results = measure(step_counts, latent, repeats, args.budget_s, args.quick)
    wall = time.perf_counter() - started
    config = {"expert": expert, "latent": list(latent), "text_tokens": TEXT_TOKENS, "seed": SEED,
              "repeats": repeats,
              "budget_s": args.budget_s, "quick": args.quick, "wall_s": round(wall, 1),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
              "cpu_count": os.cpu_count()}
    folder = args.results_dir
    os.makedirs(folder, exist_ok=True)
    name = "few_steps_quick" if args.quick else "few_steps"
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump({"config": config, "step_counts": results, "rows": rows(results)}, f, indent=2, default=str)
    text = table(results)
    with open(os.path.join(folder, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(f"# Few steps: speed-up against relative L2 (cpu, random weights"
                f"{', --quick: a smoke test' if args.quick else ''})\n\n{text}\n\n{QUICK_NOTE if args.quick else ''}"
                f"Thresholds of a method that ran the same as a lower one (same blocks, bit-identical latent) share "
                f"its timing. Plot: `{name}.png`. Config: `{json.dumps(config)}`\n")
    chart(results, os.path.join(folder, f"{name}.png"))
    print(text)
    print(f"[few_steps] {wall:.0f} s; written: {os.path.join(folder, name)}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
