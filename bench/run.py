"""`make bench`: the pack measured against ComfyUI's own graph, side by side in one process.

Prints a table and writes bench/results/latest.{json,md,png}. Timing is interleaved in rounds (A, B, C, then
C, B, A, ...), so the noise of a shared machine falls on every variant alike; each speed-up is the median over
the rounds of that round's ratio to its native run (neighbouring runs drift least apart). Every variant runs
on the same experts, loaded once by ComfyUI's own loader, from the same noise and text:

- native: the official template's graph, ModelSamplingSD3 and two KSamplerAdvanced (0 -> switch with the
  leftover noise, switch -> end), as `nodes.common_ksampler` runs them;
- native + EasyCache: the same with ComfyUI's own EasyCache node, at its defaults, on both experts;
- ours: our schedule and two-stage sampler, without a cache (must be the native latent, bit for bit), with
  the Cache-DiT defaults, and with TaylorSeer.

The weights are random: the errors say how far caching moves this run, not how a real video looks.

    .venv/bin/python -m bench.run [--repeats N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile

import torch

from bench.common import ROOT, Runs, Timer, cache_columns, interleaved, round_speedups

RESULTS = os.path.join(ROOT, "bench", "results")
# The real experts' depth (40 blocks), so that the blocks, which the cache skips, take the share of a forward
# they take in the real experts and the embeddings and head around them stay a small part; a narrow width
# keeps one forward of cond + uncond near a quarter of a second on two CPU cores.
SPEED_EXPERT = {"dim": 128, "ffn_dim": 512, "num_layers": 40}
SPEED_LATENT = (1, 16, 5, 24, 24)  # 192x192 pixels, 17 frames
RUN = {"sampler": "uni_pc", "scheduler": "simple", "steps": 20, "flow_shift": 12.0, "cfg_high": 4.0,
       "cfg_low": 3.0, "seed": 42}
ACCEPTANCE = [("native_ratio", "<=", 1.02), ("native_max_abs", "==", 0.0), ("speedup_defaults", ">=", 1.6),
              ("speedup_share", ">=", 0.9), ("rel_l2_defaults", "<=", 0.02)]


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR of latents, with the reference's value range as the peak."""
    mse = torch.mean((reference - other) ** 2).item()
    peak = (reference.max() - reference.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def rel_l2(reference: torch.Tensor, other: torch.Tensor) -> float:
    return ((other - reference).norm() / reference.norm()).item()


class Bench:
    """ComfyUI in this process with the pack loaded, and tiny experts loaded by ComfyUI's own loader."""

    def __init__(self, base: str, device: str):
        from devtools import tiny_wan
        from devtools.comfy_inprocess import InProcessComfy

        self.comfy = InProcessComfy(base, cpu=device == "cpu")
        import comfy.sd

        folder = os.path.join(base, "models", "diffusion_models")
        models = {}
        for role, seed in (("high", 1), ("low", 2)):
            path = tiny_wan.write_single_file(tiny_wan.make_expert("t2v", seed, **SPEED_EXPERT),
                                              os.path.join(folder, f"bench_{role}.safetensors"), "fp32")
            models[role] = comfy.sd.load_diffusion_model(path)
        self.cache = self.comfy.pack("nodes.core.cache")
        self.runs = Runs(self.comfy, models, sampler=RUN["sampler"], scheduler=RUN["scheduler"], steps=RUN["steps"],
                         flow_shift=RUN["flow_shift"], seed=RUN["seed"],
                         cfg={"high": RUN["cfg_high"], "low": RUN["cfg_low"]}, latent_shape=SPEED_LATENT)


def measure(device: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as base:
        bench = Bench(base, device)
        plan = bench.cache.CachePlan()
        runs = bench.runs
        variants = {
            "native": runs.native(),
            "native_easycache": runs.native(easycache=True),
            "ours": runs.ours("ours"),
            "ours_cachedit": runs.ours("ours_cachedit", plan),
            "ours_taylorseer": runs.ours("ours_taylorseer", plan.__class__(calibrator="taylorseer")),
        }
        timed = interleaved(Timer(torch.device(device)), variants, repeats)
        records = runs.records
        split = list(runs.schedule.split)
    reference, native_rounds = timed["native"][0], timed["native"][2]
    rows = {}
    for name, (latent, seconds, all_seconds) in timed.items():
        speedup, ratios = round_speedups(native_rounds, all_seconds)
        rows[name] = {"seconds": seconds, "all_seconds": all_seconds, "speedup": speedup, "speedups": ratios,
                      "rel_l2": rel_l2(reference, latent), "psnr_db": psnr_db(reference, latent),
                      "max_abs": (latent - reference).abs().max().item(), **cache_columns(records.get(name))}
    ours = rows["ours_cachedit"]
    easy = rows["native_easycache"]
    return {
        "variants": rows, "split": split,
        "native_ratio": 1 / rows["ours"]["speedup"], "native_max_abs": rows["ours"]["max_abs"],
        "speedup_defaults": ours["speedup"], "block_forward_ratio": ours["block_forward_ratio"],
        "speedup_share": ours["speedup"] / ours["block_forward_ratio"], "rel_l2_defaults": ours["rel_l2"],
        "psnr_defaults": ours["psnr_db"], "speedup_taylorseer": rows["ours_taylorseer"]["speedup"],
        "rel_l2_taylorseer": rows["ours_taylorseer"]["rel_l2"], "speedup_easycache": easy["speedup"],
        "rel_l2_easycache": easy["rel_l2"],
        # At equal or lower error, our speed-up must be at least EasyCache's.
        "beats_easycache": bool(ours["rel_l2"] > easy["rel_l2"] or ours["speedup"] >= easy["speedup"]),
    }


def holds(value, op, bound) -> bool:
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


LABELS = {"native": "native: ModelSamplingSD3 + 2 KSamplerAdvanced",
          "native_easycache": "native + EasyCache (defaults)",
          "ours": "ours, Cache-DiT off", "ours_cachedit": "ours, Cache-DiT defaults",
          "ours_taylorseer": "ours, Cache-DiT + TaylorSeer"}


def table(results: dict) -> str:
    lines = ["| run | seconds (fastest) | speed-up vs native | rel. L2 | PSNR (dB) | block-forward ratio |",
             "|---|---|---|---|---|---|"]
    for name, row in results["variants"].items():
        lines.append(f"| {LABELS[name]} | {row['seconds']:.3f} | {row['speedup']:.2f}x | {row['rel_l2']:.4f} | "
                     f"{row['psnr_db']:.1f} | {row.get('block_forward_ratio', float('nan')):.2f} |")
    lines += ["", "| measure | value | target |", "|---|---|---|"]
    checks = [("ours without cache / native (wall)", "native_ratio", "<= 1.02"),
              ("max abs difference to native, cache off", "native_max_abs", "0"),
              ("speed-up, Cache-DiT defaults", "speedup_defaults", ">= 1.6"),
              ("of the block-forward ratio (the ceiling)", "speedup_share", ">= 0.9"),
              ("relative L2, Cache-DiT defaults", "rel_l2_defaults", "<= 0.02"),
              ("at equal or lower error, at least EasyCache's speed-up", "beats_easycache", "True")]
    for label, key, target in checks:
        value = results[key]
        lines.append(f"| {label} | {value:.4g} | {target} |" if isinstance(value, float) else
                     f"| {label} | {value} | {target} |")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    torch.manual_seed(0)
    print(f"[bench] experts {SPEED_EXPERT}, latent {SPEED_LATENT}, {RUN}, {args.repeats} interleaved repeats")
    results = measure(args.device, args.repeats)
    results["config"] = {"expert": SPEED_EXPERT, "latent": list(SPEED_LATENT), "run": RUN, "repeats": args.repeats,
                         "device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
                         "machine": platform.machine(), "cpu_count": os.cpu_count()}
    results["acceptance"] = {key: holds(results[key], op, bound) for key, op, bound in ACCEPTANCE}
    results["acceptance"]["beats_easycache"] = results["beats_easycache"]
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "latest.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    text = table(results)
    with open(os.path.join(RESULTS, "latest.md"), "w", encoding="utf-8") as f:
        f.write(f"# Benchmark ({args.device}, random weights)\n\n{text}\n\nConfig: `{json.dumps(results['config'])}`\n")
    chart(results, os.path.join(RESULTS, "latest.png"))
    print(text)
    print(f"[bench] written: {os.path.join(RESULTS, 'latest.json')}, latest.md, latest.png")
    return 0 if all(results["acceptance"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
