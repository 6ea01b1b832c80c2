"""`make bench`: the pack measured against the alternatives, side by side in one process.

Prints a table and writes bench/results/latest.{json,md,png}. Timing is interleaved (A, B, B, A, ...)
and the median taken, so the noise of a shared machine falls on both sides alike.

    .venv/bin/python -m bench.run [--repeats N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import torch

from bench.common import ROOT, Timer, drop_page_cache, interleaved, pack, text_embeddings

RESULTS = os.path.join(ROOT, "bench", "results")
# One expert forward takes about 85 ms on this machine's two cores at this size, and, as in the real
# experts, attention over the video tokens dominates (720 tokens here; the 512-position umt5 text
# projection, which no cache can skip, stays a small share).
SPEED_EXPERT = {"dim": 128, "ffn_dim": 512, "num_layers": 16}
SPEED_LATENT = (1, 16, 5, 24, 24)  # 192x192 pixels, 17 frames
RUN = {"sampler": "unipc", "steps": 20, "flow_shift": 12.0, "cfg_high": 4.0, "cfg_low": 3.0, "boundary": 0.875}
# Experts large enough that their weights, not the ~0.8 GB of Python, torch and diffusers, decide the memory
# (as they do for 14B experts): 0.8 B parameters, 3.2 GB in fp32, each.
MEMORY_EXPERT = {"dim": 2048, "ffn_dim": 8192, "num_layers": 12}


def build(device):
    pack()
    from devtools import tiny_wan
    from wan22_cachedit.nodes.core.experts import Wan22Experts, WanExpertConfig

    high = tiny_wan.make_expert("t2v", 1, **SPEED_EXPERT).to(device)
    low = tiny_wan.make_expert("t2v", 2, **SPEED_EXPERT).to(device)
    experts = Wan22Experts(high_noise=high, low_noise=low, config=WanExpertConfig.from_diffusers_config(high.config),
                           dtype=torch.float32, sources=("bench-high", "bench-low"), default_boundary=RUN["boundary"])
    return experts


def run_inputs(device):
    from wan22_cachedit.nodes.core.denoise import DenoiseInputs

    noise = torch.randn(SPEED_LATENT, generator=torch.Generator().manual_seed(42))
    return DenoiseInputs(positive=text_embeddings(1), negative=text_embeddings(2), noise=noise)


def ours(experts, schedule, inputs, device):
    from wan22_cachedit.nodes.core import denoise

    placement = denoise.KeepInPlace(device)
    return lambda: denoise.denoise(experts, schedule, inputs, RUN["cfg_high"], RUN["cfg_low"], placement=placement)


def diffusers_pipeline(high, low, inputs, device, before=None):
    from diffusers import WanPipeline
    from wan22_cachedit.nodes.core.schedule import SAMPLERS

    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=SAMPLERS[RUN["sampler"]](RUN["flow_shift"]),
                       transformer=high, transformer_2=low, boundary_ratio=RUN["boundary"])
    pipe.set_progress_bar_config(disable=True)

    def call():
        if before is not None:
            before()
        return pipe(prompt_embeds=inputs.positive.to(device), negative_prompt_embeds=inputs.negative.to(device),
                    latents=inputs.noise.to(device), num_inference_steps=RUN["steps"], guidance_scale=RUN["cfg_high"],
                    guidance_scale_2=RUN["cfg_low"], output_type="latent", height=SPEED_LATENT[3] * 8,
                    width=SPEED_LATENT[4] * 8, num_frames=(SPEED_LATENT[2] - 1) * 4 + 1).frames
    return call


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR of latents, with the reference's value range as the peak."""
    mse = torch.mean((reference - other) ** 2).item()
    peak = (reference.max() - reference.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def compare_speed(device, repeats: int) -> dict:
    pack()
    import cache_dit
    from wan22_cachedit.nodes.core import cache, schedule as sched

    timer = Timer(device)
    experts = build(device)
    inputs = run_inputs(device)
    schedule = sched.build_schedule(sampler=RUN["sampler"], steps=RUN["steps"], flow_shift=RUN["flow_shift"],
                                    has_high=True, has_low=True, model_default=RUN["boundary"])
    plan = cache.CachePlan()

    # 1. overhead: our uncached sampler against diffusers' WanPipeline, same modules and inputs.
    overhead = interleaved(timer, {
        "ours": ours(experts, schedule, inputs, device),
        "wanpipeline": diffusers_pipeline(experts.high_noise, experts.low_noise, inputs, device),
    }, repeats)
    (ours_latent, _), ours_s, _ = overhead["ours"]
    pipe_latent, pipe_s, _ = overhead["wanpipeline"]

    # 2. speed-up: our sampler with the default cache plan against without.
    cached_experts = experts.replace(cache_plan=plan)
    speed = interleaved(timer, {
        "uncached": ours(experts, schedule, inputs, device),
        "cached": ours(cached_experts, schedule, inputs, device),
    }, repeats)
    (uncached_latent, uncached_record), uncached_s, _ = speed["uncached"]
    (cached_latent, cached_record), cached_s, _ = speed["cached"]
    blocks = lambda record: sum(v["block_forwards"] for v in record.cache.values())  # noqa: E731
    rel_l2 = ((cached_latent - uncached_latent).norm() / uncached_latent.norm()).item()

    # 3. against cache-dit used directly on diffusers' WanPipeline, with the same per-expert settings
    # (copies of the experts, each cached as a bare module and refreshed with its steps before each call).
    high_copy, low_copy = copy.deepcopy(experts.high_noise), copy.deepcopy(experts.low_noise)
    for module, role in ((high_copy, "high"), (low_copy, "low")):
        cache.remove(module)
        cache_dit.enable_cache(module, cache_config=plan.db_cache_config(role, None, True))

    def refresh_copies():
        for module, role, steps in ((high_copy, "high", schedule.high_steps), (low_copy, "low", schedule.low_steps)):
            cache_dit.refresh_context(module, cache_config=plan.db_cache_config(role, steps, True))

    versus = interleaved(timer, {
        "ours_cached": ours(cached_experts, schedule, inputs, device),
        "cachedit_wanpipeline": diffusers_pipeline(high_copy, low_copy, inputs, device, before=refresh_copies),
    }, repeats)
    (_, ours_cached_record), ours_cached_s, _ = versus["ours_cached"]
    library_latent, library_s, _ = versus["cachedit_wanpipeline"]
    library_steps = {}
    for module, role in ((high_copy, "high"), (low_copy, "low")):
        stats = [s for s in cache_dit.summary(module, details=False, logging=False) if s.cache_options][0]
        library_steps[role] = {"cached": sorted(stats.cached_steps), "cfg_cached": sorted(stats.cfg_cached_steps)}
    our_steps = {role: {"cached": ours_cached_record.cache[role]["cached_steps"],
                        "cfg_cached": ours_cached_record.cache[role]["cfg_cached_steps"]} for role in ("high", "low")}
    for module in (high_copy, low_copy):
        cache.remove(module)
    cache.reconcile(experts)  # leave the bench experts uncached

    return {
        "overhead_ratio": ours_s / pipe_s, "overhead_max_abs": (ours_latent - pipe_latent).abs().max().item(),
        "ours_uncached_s": ours_s, "wanpipeline_s": pipe_s,
        "speedup": uncached_s / cached_s, "block_forward_ratio": blocks(uncached_record) / blocks(cached_record),
        "uncached_s": uncached_s, "cached_s": cached_s,
        "block_forwards": {"uncached": blocks(uncached_record), "cached": blocks(cached_record)},
        "cached_steps": our_steps, "rel_l2": rel_l2, "psnr_db": psnr_db(uncached_latent, cached_latent),
        "vs_cachedit_ratio": ours_cached_s / library_s, "ours_cached_s": ours_cached_s, "cachedit_wanpipeline_s": library_s,
        "same_cached_steps": our_steps == library_steps, "cachedit_cached_steps": library_steps,
        "vs_cachedit_max_abs": (cached_latent - library_latent).abs().max().item(),
        "split": list(schedule.split),
    }


# LightX2V's 4-step LoRAs have rank 64 on 5120-wide experts: the same rank / width here.
LORA_RANK = max(1, round(64 * SPEED_EXPERT["dim"] / 5120))


def compare_lora(device, repeats: int) -> dict:
    """LoRAs on both experts, applied per run as unmerged adapters: the cost of a run with them against
    one without (separate copies of the experts, so neither call has to switch), against diffusers'
    own `load_lora_weights` on WanPipeline, and the cost of switching one set of experts between a
    handle with the LoRAs and one without (what two branches of one graph pay per run)."""
    pack()
    from devtools import tiny_wan
    from wan22_cachedit.nodes.core import lora, schedule as sched

    timer = Timer(device)
    inputs = run_inputs(device)
    plain, with_lora, switching, reference = (build(device) for _ in range(4))
    schedule = sched.build_schedule(sampler=RUN["sampler"], steps=RUN["steps"], flow_shift=RUN["flow_shift"],
                                    has_high=True, has_low=True, model_default=RUN["boundary"])
    with tempfile.TemporaryDirectory(prefix="wan22-bench-lora-") as folder:
        files = {role: tiny_wan.write_tiny_lora(plain.high_noise, os.path.join(folder, f"{role}.safetensors"),
                                                rank=LORA_RANK, seed=seed)
                 for role, seed in (("high", 81), ("low", 82))}
        uses = tuple(lora.LoraUse(role, lora.read_lora(path, lora.LORA_INPUTS[role], torch.float32), 1.0)
                     for role, path in files.items())
        with_lora = with_lora.replace(loras=uses)
        pipe_call = diffusers_pipeline(reference.high_noise, reference.low_noise, inputs, device)
        from diffusers.loaders.lora_pipeline import WanLoraLoaderMixin

        WanLoraLoaderMixin.load_lora_into_transformer(WanLoraLoaderMixin.lora_state_dict(files["high"]),
                                                      reference.high_noise, adapter_name="h")
        WanLoraLoaderMixin.load_lora_into_transformer(WanLoraLoaderMixin.lora_state_dict(files["low"]),
                                                      reference.low_noise, adapter_name="l")
    runs = interleaved(timer, {"plain": ours(plain, schedule, inputs, device),
                               "lora": ours(with_lora, schedule, inputs, device),
                               "diffusers_lora": pipe_call}, repeats)
    (_, _), plain_s, _ = runs["plain"]
    (lora_latent, _), lora_s, _ = runs["lora"]
    diffusers_latent, diffusers_s, _ = runs["diffusers_lora"]

    on, off = switching.replace(loras=uses), switching
    switches = [timer(lambda: lora.reconcile(on))[1] + timer(lambda: lora.reconcile(off))[1] for _ in range(repeats)]
    wide = lora_forward_cost_at_width(device, repeats)
    return {"lora_rank": LORA_RANK, "lora_overhead_ratio": lora_s / plain_s, "lora_s": lora_s, "plain_s": plain_s,
            "lora_vs_diffusers_ratio": lora_s / diffusers_s, "diffusers_lora_s": diffusers_s,
            "lora_max_abs": (lora_latent - diffusers_latent).abs().max().item(),
            "lora_switch_s": statistics.median(switches), **wide}


LORA_WIDE = {"dim": 2048, "ffn_dim": 8192, "num_layers": 4}


def lora_forward_cost_at_width(device, repeats: int) -> dict:
    """At the speed experts' width of 128 the adapters' per-layer calls weigh far more than at 5120; one
    forward at width 2048 (rank again scaled as LightX2V's) shows where the cost goes as width grows."""
    from devtools import tiny_wan
    from wan22_cachedit.nodes.core import lora
    from wan22_cachedit.nodes.core.experts import Wan22Experts, WanExpertConfig

    timer = Timer(device)
    model = tiny_wan.make_expert("t2v", 1, **LORA_WIDE).to(device)
    plain = Wan22Experts(high_noise=model, low_noise=None, config=WanExpertConfig.from_diffusers_config(model.config),
                         dtype=torch.float32, sources=("bench", "none"), default_boundary=RUN["boundary"])
    rank = max(1, round(64 * LORA_WIDE["dim"] / 5120))
    with tempfile.TemporaryDirectory(prefix="wan22-bench-lora-") as folder:
        path = tiny_wan.write_tiny_lora(model, os.path.join(folder, "wide.safetensors"), rank=rank)
        on = plain.replace(loras=(lora.LoraUse("high", lora.read_lora(path, "high_noise_lora", torch.float32), 1.0),))
    inputs = run_inputs(device)

    def forward():
        with torch.no_grad():
            return model(hidden_states=inputs.noise.to(device), timestep=torch.tensor([500.0], device=device),
                         encoder_hidden_states=inputs.positive.to(device), return_dict=False)[0]

    times = {"plain": [], "lora": []}
    for r in range(repeats + 1):
        for name, handle in ((("plain", plain), ("lora", on)) if r % 2 == 0 else (("lora", on), ("plain", plain))):
            lora.reconcile(handle)  # the switch is untimed: only the forward is
            seconds = timer(forward)[1]
            if r:  # the first round warms up
                times[name].append(seconds)
    lora.remove(model)
    return {"lora_wide_rank": rank, "lora_wide_forward_ratio": statistics.median(times["lora"]) / statistics.median(times["plain"])}


def write_memory_experts(folder: str) -> dict:
    from devtools import tiny_wan

    paths = {}
    for role, seed in (("high", 1), ("low", 2)):
        model = tiny_wan.make_expert("t2v", seed, **MEMORY_EXPERT)
        for fmt in ("fp32", "fp16", "fp8_scaled"):
            paths[(role, fmt)] = tiny_wan.write_single_file(model, os.path.join(folder, f"{role}_{fmt}.safetensors"), fmt)
        del model
    return paths


def compare_memory(paths: dict) -> dict:
    def probe(high, low):
        out = subprocess.run([sys.executable, "-m", "bench.memory_probe", high, low], cwd=ROOT, capture_output=True,
                             text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    low_only = probe("none", paths[("low", "fp32")])
    both = probe(paths[("high", "fp32")], paths[("low", "fp32")])
    return {"rss_ratio_low_only": low_only["peak_rss_mb"] / both["peak_rss_mb"],
            "rss_low_only_mb": low_only["peak_rss_mb"], "rss_both_mb": both["peak_rss_mb"],
            "rss_baseline_mb": both["baseline_rss_mb"]}


def compare_loading(paths: dict, repeats: int) -> dict:
    pack()
    from safetensors.torch import load_file
    from wan22_cachedit.nodes.core.experts import load_single_file_experts

    timer = Timer(torch.device("cpu"))
    cold = drop_page_cache()
    out = {"page_cache": "dropped before each read" if cold else "warm (dropping it needs root)"}
    for fmt in ("fp16", "fp8_scaled"):
        path = paths[("low", fmt)]
        # The raw read materialises every tensor (load_file alone only maps the file).
        result = interleaved(timer, {"ours": lambda: load_single_file_experts(None, path, "default"),
                                     "raw": lambda: {k: v.clone() for k, v in load_file(path).items()}}, repeats,
                             before=drop_page_cache if cold else None)
        key = "fp16" if fmt == "fp16" else "fp8"
        out[f"load_ratio_{key}"] = result["ours"][1] / result["raw"][1]
        out[f"load_{key}_s"] = result["ours"][1]
        out[f"raw_read_{key}_s"] = result["raw"][1]
    return out


ACCEPTANCE = [
    ("overhead_ratio", "<=", 1.03), ("overhead_max_abs", "<=", 1e-5), ("speedup", ">=", 1.6),
    ("rel_l2", "<=", 0.02), ("vs_cachedit_ratio", "<=", 1.03), ("same_cached_steps", "==", True),
    ("rss_ratio_low_only", "<=", 0.6), ("load_ratio_fp16", "<=", 1.3), ("load_ratio_fp8", "<=", 1.3),
    ("lora_vs_diffusers_ratio", "<=", 1.03), ("lora_max_abs", "<=", 1e-5),
]


def holds(value, op, bound) -> bool:
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


def table(results: dict) -> str:
    rows = [("overhead: ours uncached / WanPipeline (wall)", "overhead_ratio", "<= 1.03"),
            ("overhead: max abs difference of latents", "overhead_max_abs", "<= 1e-5"),
            ("speed-up: uncached / cached (wall)", "speedup", ">= 1.6"),
            ("block-forward ratio (ceiling)", "block_forward_ratio", ""),
            ("speed-up / block-forward ratio", "speedup_share", ">= 0.9"),
            ("cache error: relative L2 of latents", "rel_l2", "<= 0.02"),
            ("cache error: PSNR of latents (dB)", "psnr_db", ""),
            ("ours cached / cache-dit on WanPipeline (wall)", "vs_cachedit_ratio", "<= 1.03"),
            ("same cached steps per expert as cache-dit direct", "same_cached_steps", "== True"),
            ("peak RSS, low-noise only / both experts", "rss_ratio_low_only", "<= 0.6"),
            ("single-file load / raw safetensors read, fp16", "load_ratio_fp16", "<= 1.3"),
            ("single-file load / raw safetensors read, fp8", "load_ratio_fp8", "<= 1.3"),
            ("LoRA run / plain run (wall), LightX2V's rank/width", "lora_overhead_ratio", ""),
            ("ours with LoRA / WanPipeline + diffusers LoRA (wall)", "lora_vs_diffusers_ratio", "<= 1.03"),
            ("LoRA: max abs difference to diffusers' LoRA run", "lora_max_abs", "<= 1e-5"),
            ("LoRA on + off on one set of experts (s)", "lora_switch_s", ""),
            ("LoRA forward / plain forward at width 2048", "lora_wide_forward_ratio", "")]
    lines = ["| measure | value | target |", "|---|---|---|"]
    for label, key, target in rows:
        value = results[key]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"| {label} | {shown} | {target} |")
    return "\n".join(lines)


def chart(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["WanPipeline", "ours", "ours + cache", "cache-dit on\nWanPipeline"]
    values = [results["wanpipeline_s"], results["ours_uncached_s"], results["cached_s"], results["cachedit_wanpipeline_s"]]
    left.bar(names, values, color=["#888888", "#4287f5", "#e88b2c", "#b06ad9"])
    left.set_ylabel("seconds per run (median)")
    left.set_title(f"{RUN['steps']} {RUN['sampler']} steps, split {results['split'][0]}/{results['split'][1]}")
    ratios = ["overhead_ratio", "speedup", "block_forward_ratio", "vs_cachedit_ratio", "rss_ratio_low_only",
              "load_ratio_fp16", "load_ratio_fp8"]
    right.barh(ratios, [results[k] for k in ratios], color="#4287f5")
    right.axvline(1.0, color="#444444", linewidth=1)
    right.set_title("ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    torch.manual_seed(0)

    print(f"[bench] speed: experts {SPEED_EXPERT}, latent {SPEED_LATENT}, {RUN}, {args.repeats} interleaved repeats")
    results = compare_speed(device, args.repeats)
    results["speedup_share"] = results["speedup"] / results["block_forward_ratio"]
    print(f"[bench] LoRA: rank {LORA_RANK} on every block linear of both experts")
    results.update(compare_lora(device, args.repeats))
    with tempfile.TemporaryDirectory(prefix="wan22-bench-") as folder:
        print(f"[bench] memory and loading: experts {MEMORY_EXPERT}")
        paths = write_memory_experts(folder)
        results.update(compare_memory(paths))
        results.update(compare_loading(paths, args.repeats))
    results["config"] = {"page_cache": results.pop("page_cache"), "speed_expert": SPEED_EXPERT, "speed_latent": list(SPEED_LATENT), "run": RUN,
                         "memory_expert": MEMORY_EXPERT, "repeats": args.repeats, "device": args.device,
                         "threads": torch.get_num_threads(), "torch": torch.__version__,
                         "machine": platform.machine(), "cpu_count": os.cpu_count()}
    results["acceptance"] = {key: holds(results[key], op, bound) for key, op, bound in ACCEPTANCE}
    results["acceptance"]["speedup_share"] = results["speedup_share"] >= 0.9

    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "latest.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    text = table(results)
    with open(os.path.join(RESULTS, "latest.md"), "w") as f:
        f.write(f"# Benchmark ({args.device})\n\n{text}\n\nConfig: `{json.dumps(results['config'])}`\n")
    chart(results, os.path.join(RESULTS, "latest.png"))
    print(text)
    print(f"[bench] written: {os.path.join(RESULTS, 'latest.json')}, latest.md, latest.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
