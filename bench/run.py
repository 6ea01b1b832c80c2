"""`make bench`: the pack measured against ComfyUI's own graph, side by side in one process.

Prints a table and writes bench/results/latest.{json,md,png}. Timing is interleaved in rounds (A, B, C, then
C, B, A, ...), so the noise of a shared machine falls on every variant alike; each speed-up is the median over
the rounds of that round's ratio to its native run (neighbouring runs drift least apart). Every variant runs
on the same experts, loaded once by ComfyUI's own loader, from the same noise and text:

- native: the official template's graph, ModelSamplingSD3 and two KSamplerAdvanced (0 -> switch with the
  leftover noise, switch -> end), as `nodes.common_ksampler` runs them;
- native + EasyCache: the same with ComfyUI's own EasyCache node, at its defaults, on both experts;
- ours: our schedule and two-stage sampler, without a cache (must be the native latent, bit for bit), with
  Cache-DiT at CACHE_THRESHOLD (0.24) and the node's other defaults, and the same with TaylorSeer.

The weights are random, and random experts do not denoise: with the Cache-DiT node's default (the error
criterion) or at the threshold 0.05, their residuals change too much between steps for any step to be cached,
so the cached rows would time the hooks only. They run with the threshold criterion at 0.24 instead
(bench.common.random_weights_plan, with the saved workflows' warm-ups 4 / 2), where these experts cache every
step the plan's caps allow (measured, see CACHE_THRESHOLD). That threshold says nothing of quality, nor do the error
columns: they say how far caching moves this run, not how a real video looks (bench/quality/ measures
quality, on the trained test beds). Each target says what it can show here:

- the pack's own seconds per run (cache off) over native's <= 0.02: the pack's sampler costs no more than
  ComfyUI's own graph. Its cost (wrappers, clones, checks: fixed per call and per run) is timed where the
  transformer costs next to nothing, over many interleaved pairs (OVERHEAD_ROUNDS): the wall-clock ratio of
  the cache-off row, reported, varies from round to round on a shared machine by more than 2%;
- max abs difference to native with the cache off == 0: the pack's sampler is the native graph, bit for bit;
- speed-up at 0.24 >= 1.6: the steps cached reach the wall clock (how many are cached is these random
  weights' doing, not a real video's);
- speed-up per block skipped (the speed-up over the block-forward ratio, its ceiling) >= 0.9: the cache's own
  work (hooks, residual checks) eats less than a tenth of what skipping blocks saves;
- relative L2 at 0.24 <= 0.02: a sanity bound (a cache that reused the wrong residual, another expert's or
  another prompt's, moves the latent far more), not a quality figure;
- at equal or lower relative L2, at least EasyCache's speed-up: EasyCache at its defaults on the same random
  experts, a comparison of what each skips here, not of quality.

`--quick` is a smoke test of the script: a 4-block expert, a 16-token latent, one round on one torch thread; it
writes latest_quick.* and judges only the bit-identity with the cache off (its figures claim nothing).

    .venv/bin/python -m bench.run [--repeats N] [--device cpu|cuda] [--quick] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile

import torch

from bench.common import (QUICK_NOTE, Runs, Timer, add_output_arguments, at_least, cache_columns, interleaved,
                          random_weights_plan, round_speedups)

# The real experts' depth (40 blocks), so that the blocks, which the cache skips, take the share of a forward
# they take in the real experts and the embeddings and head around them stay a small part; a narrow width
# keeps one forward of cond + uncond near a quarter of a second on two CPU cores.
SPEED_EXPERT = {"dim": 128, "ffn_dim": 512, "num_layers": 40}
SPEED_LATENT = (1, 16, 5, 24, 24)  # 192x192 pixels, 17 frames
QUICK_EXPERT = {"dim": 128, "ffn_dim": 256, "num_layers": 4}
QUICK_LATENT = (1, 16, 1, 8, 8)  # 16 tokens
RUN = {"sampler": "uni_pc", "scheduler": "simple", "steps": 20, "flow_shift": 12.0, "cfg_high": 4.0,
       "cfg_low": 3.0, "seed": 42}
# The cached variants' threshold, for these random experts only (it says nothing of quality). Each threshold run
# once on them (RUN, SPEED_EXPERT, SPEED_LATENT, 2026-12-05): steps cached of 20 (high + low), block-forward ratio:
#   0.05 (the node's default): 0 + 0, 1.00;  0.12: 8 + 1, 1.78;  0.16, 0.24, 0.5: 8 + 3, 2.16
# (TaylorSeer at 0.24: the same 8 + 3). From 0.16 up they cache every step the plan's caps allow (high: warm-up 4
# and at most 3 in a row; low: warm-up 2). 0.24 leaves a margin above 0.16, so that a small change to the
# experts or the sampler does not move the count, and is the threshold the plumbing tests use on random weights
# (tests/in_comfyui/prompts.RANDOM_WEIGHTS_THRESHOLD) and the shipped workflows were saved with.
CACHE_THRESHOLD = 0.24
# The pack's own cost per run (cache off) is measured apart from the wall-clock rows: ours without cache runs the
# native graph's kernels, the same calls of the same shapes, plus its wrappers, clones and checks, a fixed
# cost per transformer call and per run that does not grow with the tensors. The wall-clock ratio cannot show
# it on a shared machine: a run of this shape varies by 5 to 10% from one round to the next (2026-12-06:
# neighbouring pairs 0.91 to 1.13, cProfile of one pair 0.6% apart, same kernels), far more than a 2% target.
# So that cost is timed where the transformer costs next to nothing (QUICK_EXPERT, QUICK_LATENT, the same
# run: the same calls and wrappers), as the median over OVERHEAD_ROUNDS interleaved pairs of ours' seconds
# minus native's, and judged against native's seconds at this shape.
OVERHEAD_ROUNDS = 21
# (key, op, bound, label, what it can show on random weights): the docstring says more.
TARGETS = [
    ("overhead_share", "<=", 0.02, "the pack's own seconds per run (cache off) / native's",
     "the pack's sampler costs no more than ComfyUI's graph (see OVERHEAD_ROUNDS)"),
    ("native_max_abs", "==", 0.0, "max abs difference to native, cache off", "bit for bit the native graph"),
    ("speedup_cached", ">=", 1.6, f"speed-up, Cache-DiT at {CACHE_THRESHOLD}",
     "the cached steps reach the wall clock (how many: the random weights' doing)"),
    ("speedup_share", ">=", 0.9, "speed-up per block skipped (of the block-forward ratio, the ceiling)",
     "the cache's own work eats under a tenth of what skipping saves"),
    ("rel_l2_cached", "<=", 0.02, f"relative L2, Cache-DiT at {CACHE_THRESHOLD}",
     "a sanity bound (a wrong residual reused moves it far more), not quality"),
    ("beats_easycache", "==", True, "at equal or lower error, at least EasyCache's speed-up",
     "what each skips on these random experts, not quality"),
]
ACCEPTANCE = [(key, op, bound) for key, op, bound, _label, _shows in TARGETS]


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR of latents, with the reference's value range as the peak."""
    mse = torch.mean((reference - other) ** 2).item()
    peak = (reference.max() - reference.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def rel_l2(reference: torch.Tensor, other: torch.Tensor) -> float:
    """The pack's own measure (the error a budget bounds), so that the benchmarks and the budget agree."""
    from devtools.paths import import_pack

    import_pack()
    from wan22_cachedit.nodes.core.budget import relative_l2

    return relative_l2(reference, other)


class Bench:
    """ComfyUI in this process with the pack loaded, and tiny experts loaded by ComfyUI's own loader."""

    def __init__(self, base: str, device: str, expert: dict = SPEED_EXPERT, latent: tuple = SPEED_LATENT):
        from devtools.comfy_inprocess import InProcessComfy

        self.comfy = InProcessComfy(base, cpu=device == "cpu")
        self.base = base
        self.cache = self.comfy.pack("nodes.core.cache")
        self.runs = self.runs_on(expert, latent, "bench")

    def runs_on(self, expert: dict, latent: tuple, prefix: str) -> Runs:
        """RUN on two experts of this shape (seeds 1 and 2), loaded by ComfyUI's own loader."""
        import comfy.sd
        from devtools import tiny_wan

        folder = os.path.join(self.base, "models", "diffusion_models")
        models = {}
        for role, seed in (("high", 1), ("low", 2)):
            path = tiny_wan.write_single_file(tiny_wan.make_expert("t2v", seed, **expert),
                                              os.path.join(folder, f"{prefix}_{role}.safetensors"), "fp32")
            models[role] = comfy.sd.load_diffusion_model(path)
        return Runs(self.comfy, models, sampler=RUN["sampler"], scheduler=RUN["scheduler"], steps=RUN["steps"],
                    flow_shift=RUN["flow_shift"], seed=RUN["seed"],
                    cfg={"high": RUN["cfg_high"], "low": RUN["cfg_low"]}, latent_shape=latent)


def measure(device: str, repeats: int, quick: bool = False) -> dict:
    expert, latent = (QUICK_EXPERT, QUICK_LATENT) if quick else (SPEED_EXPERT, SPEED_LATENT)
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as base:
        bench = Bench(base, device, expert, latent)
        plan = random_weights_plan(bench.cache, CACHE_THRESHOLD)  # not the node's default: see above
        runs = bench.runs
        variants = {
            "native": runs.native(),
            "native_easycache": runs.native(easycache=True),
            "ours": runs.ours("ours"),
            "ours_cachedit": runs.ours("ours_cachedit", plan),
            "ours_taylorseer": runs.ours("ours_taylorseer", random_weights_plan(bench.cache, CACHE_THRESHOLD,
                                                                                calibrator="taylorseer")),
        }
        timed = interleaved(Timer(torch.device(device)), variants, repeats)
        records = runs.records
        split = list(runs.schedule.split)
        cheap = runs if quick else bench.runs_on(QUICK_EXPERT, QUICK_LATENT, "overhead")  # quick: that shape already
        pairs = interleaved(Timer(torch.device(device)), {"native": cheap.native(), "ours": cheap.ours("ours")},
                            3 if quick else OVERHEAD_ROUNDS)
    reference, native_rounds = timed["native"][0], timed["native"][2]
    rows = {}
    for name, (latent, seconds, all_seconds) in timed.items():
        speedup, ratios = round_speedups(native_rounds, all_seconds)
        rows[name] = {"seconds": seconds, "all_seconds": all_seconds, "speedup": speedup, "speedups": ratios,
                      "rel_l2": rel_l2(reference, latent), "psnr_db": psnr_db(reference, latent),
                      "max_abs": (latent - reference).abs().max().item(), **cache_columns(records.get(name))}
    ours = rows["ours_cachedit"]
    easy = rows["native_easycache"]
    added = statistics.median(o - n for n, o in zip(pairs["native"][2], pairs["ours"][2]))
    native_seconds = statistics.median(native_rounds)
    return {
        "variants": rows, "split": split, "cache_threshold": CACHE_THRESHOLD,
        "native_max_abs": rows["ours"]["max_abs"],
        "overhead": {"added_seconds": added, "rounds": len(pairs["native"][2]), "expert": QUICK_EXPERT,
                     "latent": list(QUICK_LATENT), "native_seconds": pairs["native"][2],
                     "ours_seconds": pairs["ours"][2]},
        "overhead_share": added / native_seconds,
        "speedup_cached": ours["speedup"], "block_forward_ratio": ours["block_forward_ratio"],
        "speedup_share": ours["speedup"] / ours["block_forward_ratio"], "rel_l2_cached": ours["rel_l2"],
        "psnr_cached": ours["psnr_db"], "speedup_taylorseer": rows["ours_taylorseer"]["speedup"],
        "rel_l2_taylorseer": rows["ours_taylorseer"]["rel_l2"], "speedup_easycache": easy["speedup"],
        "rel_l2_easycache": easy["rel_l2"],
        # At equal or lower error, our speed-up must be at least EasyCache's.
        "beats_easycache": bool(ours["rel_l2"] > easy["rel_l2"] or ours["speedup"] >= easy["speedup"]),
    }


def holds(value, op, bound) -> bool:
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


LABELS = {"native": "native: ModelSamplingSD3 + 2 KSamplerAdvanced",
          "native_easycache": "native + EasyCache (defaults)",
          "ours": "ours, Cache-DiT off", "ours_cachedit": f"ours, Cache-DiT at {CACHE_THRESHOLD} (random weights)",
          "ours_taylorseer": f"ours, Cache-DiT at {CACHE_THRESHOLD} + TaylorSeer"}


def table(results: dict) -> str:
    lines = ["| run | seconds (fastest) | speed-up vs native | rel. L2 | PSNR (dB) | block-forward ratio |",
             "|---|---|---|---|---|---|"]
    for name, row in results["variants"].items():
        lines.append(f"| {LABELS[name]} | {row['seconds']:.3f} | {row['speedup']:.2f}x | {row['rel_l2']:.4f} | "
                     f"{row['psnr_db']:.1f} | {row.get('block_forward_ratio', float('nan')):.2f} |")
    lines += ["", "| measure | value | target | what it can show (random weights) |", "|---|---|---|---|"]
    for key, op, bound, label, shows in TARGETS:
        value = results[key]
        shown = f"{value:.4g}" if isinstance(value, float) else f"{value}"
        bound_text = f"{bound:g}" if isinstance(bound, float) else f"{bound}"
        target = bound_text if op == "==" else f"{op} {bound_text}"
        lines.append(f"| {label} | {shown} | {target} | {shows} |")
    over = results["overhead"]
    wall = [1 / ratio for ratio in results["variants"]["ours"]["speedups"]]
    tokens = over["latent"][2] * (over["latent"][3] // 2) * (over["latent"][4] // 2)
    lines += ["", f"The pack's own seconds per run, cache off: {over['added_seconds'] * 1000:+.1f} ms (the median over "
                  f"{over['rounds']} interleaved pairs of ours minus native, on {over['expert']['num_layers']}-block "
                  f"experts over {tokens} tokens, where the transformer costs next to nothing); the cache-off "
                  f"row's wall-clock ratio to native ranged {min(wall):.3f} to {max(wall):.3f} over the rounds."]
    return "\n".join(lines)


def chart(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"native": "#888888", "native_easycache": "#2ca02c", "ours": "#4287f5", "ours_cachedit": "#e88b2c",
               "ours_taylorseer": "#b06ad9"}
    for name, row in results["variants"].items():
        ax.scatter(row["rel_l2"], row["speedup"], s=80, color=colours[name], label=LABELS[name], zorder=3)
    ax.axhline(1.0, color="#444444", linewidth=0.8)
    ax.set_xlabel("relative L2 of the latent against the uncached native graph")
    ax.set_ylabel("speed-up against the uncached native graph")
    ax.set_title(f"{RUN['steps']} {RUN['sampler']}/{RUN['scheduler']} steps, shift {RUN['flow_shift']:g}, split "
                 f"{results['split'][0]}/{results['split'][1]} (random weights)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


HEADING_NOTE = (f"The cached rows run at threshold {CACHE_THRESHOLD}, where these random experts cache (at the node's "
                "default they cache nothing); it says nothing of quality, nor do the error columns (bench/quality/ "
                "measures quality on the trained test bed). ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), help="timed rounds (default 5; 1 with --quick)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_output_arguments(parser, "a 4-block expert, 16 tokens, one round: a smoke test of the script, no figures "
                                 "(judges only the bit-identity with the cache off)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    repeats = args.repeats or (1 if args.quick else 5)
    expert, latent = (QUICK_EXPERT, QUICK_LATENT) if args.quick else (SPEED_EXPERT, SPEED_LATENT)
    if args.quick:
        torch.set_num_threads(1)  # two threads on two shared cores stall many times over when another process runs
    torch.manual_seed(0)
    print(f"[bench] experts {expert}, latent {latent}, {RUN}, Cache-DiT at {CACHE_THRESHOLD}, {repeats} interleaved "
          f"repeats{' (--quick: a smoke test, no figures)' if args.quick else ''}")
    results = measure(args.device, repeats, args.quick)
    results["config"] = {"expert": expert, "latent": list(latent), "run": RUN, "cache_threshold": CACHE_THRESHOLD,
                         "repeats": repeats, "quick": args.quick, "device": args.device,
                         "threads": torch.get_num_threads(), "torch": torch.__version__,
                         "machine": platform.machine(), "cpu_count": os.cpu_count()}
    results["acceptance"] = {key: holds(results[key], op, bound) for key, op, bound in ACCEPTANCE}
    stem = "latest_quick" if args.quick else "latest"
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    text = table(results)
    heading = f"Benchmark ({args.device}, random weights{', --quick: a smoke test' if args.quick else ''})"
    note = (QUICK_NOTE if args.quick else "") + HEADING_NOTE
    with open(os.path.join(args.results_dir, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(f"# {heading}\n\n{text}\n\n{note}Config: `{json.dumps(results['config'])}`\n")
    chart(results, os.path.join(args.results_dir, f"{stem}.png"))
    print(text)
    print(f"[bench] written: {os.path.join(args.results_dir, stem + '.json')}, {stem}.md, {stem}.png")
    if args.quick:  # the figures claim nothing; the cache off must still be the native graph, bit for bit
        return 0 if results["acceptance"]["native_max_abs"] else 1
    return 0 if all(results["acceptance"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
