"""torch.compile and the cache: which way of compiling pays, measured side by side in one process.

The same experts, noise and text as bench.run (40 narrow blocks, loaded once by ComfyUI's own loader), the
pack's sampler, each way of compiling with the cache off and with Cache-DiT on at bench.run's threshold 0.24
(the node's other defaults): the weights are random, and at the node's default threshold they cache nothing,
so the cache-on rows would time the hooks only; 0.24 says nothing of quality (bench/run.py, CACHE_THRESHOLD):

- eager: no compile;
- whole model: ComfyUI's TorchCompileModel, which compiles `diffusion_model` (what its node does, through
  ComfyUI's own `set_torch_compile_wrapper`);
- per block: each of `diffusion_model.blocks.{i}` compiled, through the same ComfyUI helper (what KJNodes'
  TorchCompileModelWanVideoV2 does by default).

Every variant runs once untimed first (the run that compiles; its seconds are reported as the compile run),
then the rounds are interleaved (the order reverses each round), and each speed-up is the median over the
rounds of that round's ratio to eager without cache. Inductor on the CPU: what the ratios say about a GPU is
only their direction. The weights are random.

Prints a table and writes bench/results/compile.{json,md}. --quick is a smoke test of the script (a 2-block
expert, 16 tokens, 8 steps, one round; its figures claim nothing): it writes compile_quick.* instead.

    .venv/bin/python -m bench.compile [--repeats N] [--quick] [--results-dir DIR]
"""

from __future__ import annotations

import os
import platform
import tempfile
import time

from bench.common import (Runs, Timer, cache_columns, interleaved, random_weights_plan, repeats_main, round_speedups,
                          tiny_experts)
from bench.run import CACHE_THRESHOLD, QUICK_EXPERT, QUICK_LATENT, RUN, SPEED_EXPERT, SPEED_LATENT, rel_l2

QUICK_EXPERT = {**QUICK_EXPERT, "num_layers": 2}  # the quick run is mostly compiling: the fewer blocks, the sooner
QUICK_STEPS = 8  # fewer than RUN's 20, for the same reason; the cache still caches
MODES = ("eager", "whole model", "per block")


def compiled(model, mode: str, layers: int):
    """The MODEL as each compile node makes it: a clone with ComfyUI's compile wrapper on the keys it compiles."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    if mode == "eager":
        return model
    keys = ["diffusion_model"] if mode == "whole model" else [f"diffusion_model.blocks.{i}" for i in range(layers)]
    clone = model.clone(disable_dynamic=True) if mode == "whole model" else model.clone()
    set_torch_compile_wrapper(model=clone, backend="inductor", keys=keys)
    return clone


def measure(repeats: int, quick: bool) -> dict:
    expert, latent = (QUICK_EXPERT, QUICK_LATENT) if quick else (SPEED_EXPERT, SPEED_LATENT)
    steps = QUICK_STEPS if quick else RUN["steps"]
    with tempfile.TemporaryDirectory(prefix="wan22-bench-compile-") as base:
        harness, loaded = tiny_experts(base, expert)
        import torch._dynamo

        plan = random_weights_plan(harness.pack("nodes.core.cache"), CACHE_THRESHOLD)
        import torch._inductor.config

        torch._dynamo.config.cache_size_limit = 64  # as KJNodes' node sets it: one graph per block and path
        torch._inductor.config.fx_graph_cache = False  # the compile run compiles, whatever earlier processes left
        variants, runs, first_run = {}, {}, {}
        for mode in MODES:
            models = {role: compiled(m, mode, expert["num_layers"]) for role, m in loaded.items()}
            runs[mode] = Runs(harness, models, sampler=RUN["sampler"], scheduler=RUN["scheduler"], steps=steps,
                              flow_shift=RUN["flow_shift"], seed=RUN["seed"],
                              cfg={"high": RUN["cfg_high"], "low": RUN["cfg_low"]}, latent_shape=latent)
            for cache in (False, True):
                name = f"{mode}, cache {'on' if cache else 'off'}"
                variants[name] = runs[mode].ours(name, plan if cache else None)
                started = time.perf_counter()
                variants[name]()  # compiles
                first_run[name] = time.perf_counter() - started
        timed = interleaved(Timer(torch.device("cpu")), variants, repeats)
        records = {name: record for r in runs.values() for name, record in r.records.items()}
    reference = timed["eager, cache off"]
    rows = {}
    for name, (out, seconds, all_seconds) in timed.items():
        speedup, ratios = round_speedups(reference[2], all_seconds)
        compile_info = records[name].compile or {}
        rows[name] = {"seconds": seconds, "all_seconds": all_seconds, "first_run_seconds": first_run[name],
                      "speedup": speedup, "speedups": ratios, "rel_l2": rel_l2(reference[0], out),
                      "graphs_compiled_in_timed_runs": compile_info.get("graphs_compiled", 0),
                      **cache_columns(records[name])}
    return {"variants": rows, "config": {"expert": expert, "latent": list(latent), "run": {**RUN, "steps": steps},
                                         "cache_threshold": CACHE_THRESHOLD, "quick": quick, "repeats": repeats,
                                         "threads": torch.get_num_threads(), "torch": torch.__version__,
                                         "machine": platform.machine(), "cpu_count": os.cpu_count()}}


def table(results: dict) -> str:
    lines = ["| run | seconds (fastest) | first run (compiles) | speed-up vs eager, cache off | rel. L2 | "
             "graphs compiled after the first run |", "|---|---|---|---|---|---|"]
    for name, row in results["variants"].items():
        lines.append(f"| {name} | {row['seconds']:.3f} | {row['first_run_seconds']:.1f} | {row['speedup']:.2f}x | "
                     f"{row['rel_l2']:.4f} | {row['graphs_compiled_in_timed_runs']} |")
    return "\n".join(lines)


def main() -> int:
    return repeats_main(__doc__, measure, table, "compile",
                        "torch.compile and the cache (CPU, inductor, random weights)",
                        f"Cache on: Cache-DiT at {CACHE_THRESHOLD}, where these random experts cache (at the node's "
                        "default they cache nothing); it says nothing of quality. ")


if __name__ == "__main__":
    raise SystemExit(main())
