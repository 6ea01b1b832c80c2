"""Shared set-up for the benchmarks: text embeddings shaped like a real run's, and interleaved timing."""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


RESULTS = os.path.join(ROOT, "bench", "results")
QUICK_NOTE = ("A smoke test of the script (--quick): a tiny model and one round; its figures claim nothing, and no "
              "target is judged. ")


def random_weights_plan(cache, threshold: float, warmups: tuple[int, int] = (4, 2), **changes):
    """The cache plan the random-weight benchmarks time: the threshold criterion at `threshold` (random experts'
    residuals move so much from step to step that the error criterion, the node's default, caches nothing on
    them; what is timed is the cache's speed, not its quality), the saved workflows' warm-ups (high, low) unless
    given, the rest at the node's defaults. `cache` is the pack's nodes.core.cache."""
    return cache.CachePlan(criterion="threshold", residual_diff_threshold=threshold,
                           high=cache.ExpertCacheSettings(warmups[0], -1),
                           low=cache.ExpertCacheSettings(warmups[1], 20), **changes)


def at_least(minimum: int):
    """An argparse type: an integer of at least `minimum`. argparse names the option in the error it prints
    (`argument --repeats: 0: must be at least 1`), where a count the benchmark cannot use would crash later."""
    import argparse

    def parse(text: str) -> int:
        value = int(text)  # not an integer: argparse's own "invalid int value"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum}")
        return value
    parse.__name__ = "int"
    return parse


def add_output_arguments(parser, quick_help: str) -> None:
    """`--quick` (a smoke test: its results go to {stem}_quick.*, never over the kept ones) and `--results-dir`."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--results-dir", default=RESULTS,
                        help="where the results are written (default bench/results; --quick writes *_quick.* there)")


def write_results(stem: str, heading: str, text: str, results: dict, note: str = "", folder: str = RESULTS) -> None:
    """{folder}/{stem}.json (the figures) and {stem}.md (the table under a heading, the run's config), and the
    table printed."""
    import json

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    with open(os.path.join(folder, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(f"# {heading}\n\n{text}\n\n{note}Config: `{json.dumps(results['config'])}`\n")
    print(text)
    print(f"[bench] written: {os.path.join(folder, stem + '.json')}, {stem}.md")


def plot_grid(count: int, width: float, height: float):
    """(figure, axes) of a grid of `count` plots, three to a row, drawn without a display."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, count)
    return plt.subplots(-(-count // cols), cols, figsize=(width * cols, height * -(-count // cols)), squeeze=False)


def finish_grid(fig, axes, used: int, title: str, path: str) -> None:
    """A grid of plots finished alike: unused cells off, the legend in the first of them (else below), the title,
    saved to `path`."""
    spare = list(axes.flat)[used:]
    for ax in spare:
        ax.axis("off")
    legend = {}  # every plot's entries, once each (the first plot may lack some)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    if spare:
        spare[0].legend(handles, labels, loc="center", fontsize=8)
    else:
        fig.legend(handles, labels, loc="lower center", fontsize=7, ncol=3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0 if spare else 0.08, 1, 1))
    fig.savefig(path, dpi=100)


def tiny_experts(base: str, expert: dict):
    """A ComfyUI loaded in this process on `base`, and two random experts of the given shape written there
    as fp32 files and loaded by ComfyUI's own loader: (the harness, role -> MODEL)."""
    from devtools import tiny_wan
    from devtools.comfy_inprocess import InProcessComfy

    harness = InProcessComfy(base)
    import comfy.sd

    folder = os.path.join(base, "models", "diffusion_models")
    return harness, {role: comfy.sd.load_diffusion_model(tiny_wan.write_single_file(
        tiny_wan.make_expert("t2v", seed, **expert), os.path.join(folder, f"bench_{role}.safetensors"), "fp32"))
        for role, seed in (("high", 1), ("low", 2))}


def repeats_main(doc: str, measure, table, stem: str, heading: str, note: str = "") -> int:
    """The command line of a benchmark that takes `--repeats`, `--quick` and `--results-dir`: measure, print,
    write. `--quick` runs one round unless `--repeats` says otherwise, and writes {stem}_quick.* under a heading
    that says it claims nothing."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), help="timed rounds (default 5; 1 with --quick)")
    add_output_arguments(parser, "a tiny model and one round: a smoke test of the script, no figures")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    if args.quick:
        torch.set_num_threads(1)  # two threads on two shared cores stall many times over when another process runs
    torch.manual_seed(0)
    results = measure(repeats, args.quick)
    if args.quick:
        write_results(f"{stem}_quick", f"{heading}: --quick, a smoke test", table(results), results, QUICK_NOTE,
                      args.results_dir)
    else:
        write_results(stem, heading, table(results), results, note, args.results_dir)
    return 0


class Timer:
    """Wall time on the CPU; CUDA events on a GPU (both synchronised at the end of the measured call)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            result = fn()
            end.record()
            torch.cuda.synchronize()
            return result, start.elapsed_time(end) / 1000.0
        started = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - started


def interleaved(timer: Timer, runs: dict, repeats: int, budget_s: float | None = None) -> dict:
    """Runs each callable `repeats` times, alternating their order round by round so that machine noise
    falls on all of them alike. Returns {name: (last result, fastest seconds, all seconds in round order)}.
    `budget_s`: a further round starts only if it should end within that many seconds (the first always runs)."""
    names = list(runs)
    times = {name: [] for name in names}
    results = {}
    started = time.perf_counter()
    for r in range(repeats):
        elapsed = time.perf_counter() - started
        if budget_s is not None and r and elapsed + elapsed / r > budget_s:
            break  # another round would not fit
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            results[name], seconds = timer(runs[name])
            times[name].append(seconds)
    return {name: (results[name], min(times[name]), times[name]) for name in names}


def round_speedups(reference: list[float], seconds: list[float]) -> tuple[float, list[float]]:
    """Each round's ratio of the reference run's time to this run's (neighbouring runs drift least apart), and
    their median over the rounds."""
    ratios = [r / s for r, s in zip(reference, seconds)]
    return statistics.median(ratios), ratios


def cache_columns(record) -> dict:
    """What one of our cached runs did, for a benchmark row: its cached steps per expert, the block forwards
    a run without cache makes against those it made (the ceiling of its speed-up), and the most memory a stage's
    cache held and asked ComfyUI's memory management for (bytes)."""
    if record is None or not record.cache:
        return {}
    stats = record.cache.values()
    return {"block_forward_ratio": sum(s["block_forwards_without_cache"] for s in stats)
            / sum(s["block_forwards"] for s in stats),
            "cached_steps": {role: s["cached_steps"] for role, s in record.cache.items()},
            "cache_held_bytes": max(s.get("held_bytes", 0) for s in stats),
            "cache_asked_bytes": max(s.get("memory_asked_bytes", 0) for s in stats)}


def text_embeddings(seed: int, tokens: int = 512, real: int = 24, width: int = 4096) -> torch.Tensor:
    """Shaped like umt5 output: 512 positions, zeros past the prompt's own tokens."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(1, tokens, width)
    out[:, :real] = torch.randn(1, real, width, generator=g)
    return out


class Runs:
    """The runs a benchmark puts side by side, on the same experts (ComfyUI MODELs, role -> MODEL), noise and
    text, in a ComfyUI loaded in this process: ours (the pack's sampler, with or without a cache plan) and
    native (ModelSamplingSD3 and two KSamplerAdvanced, as `nodes.common_ksampler` runs them, with or without
    ComfyUI's EasyCache at its defaults). Each is a callable returning the final latent; `records` keeps
    what each of ours did."""

    def __init__(self, comfy, models: dict, *, sampler: str, scheduler: str, steps: int, flow_shift: float, seed: int,
                 cfg: dict, latent_shape: tuple):
        self.models, self.steps, self.seed, self.cfg = models, steps, seed, cfg
        self.sampler, self.scheduler, self.flow_shift = sampler, scheduler, flow_shift
        self.engine = comfy.pack("nodes.engine")
        self.sampling = comfy.pack("nodes.dispatch")  # its run: one process, or the parallel plan's workers
        self.experts = comfy.pack("nodes.expert_models").experts_handle(models)
        self.schedule = comfy.pack("nodes.sigmas").build_schedule(
            has_high=True, has_low=True, model_default=self.experts.default_boundary, sampler=sampler,
            scheduler=scheduler, steps=steps, flow_shift=flow_shift)
        self.handle = comfy.pack("nodes.types").ScheduleHandle(self.schedule)  # what the schedule socket carries
        self.positive, self.negative = [[text_embeddings(1), {}]], [[text_embeddings(2), {}]]
        self.latent = {"samples": torch.zeros(latent_shape)}
        self.records = {}

    def ours(self, name: str, plan=None):
        experts = self.experts.replace(cache_plan=plan)

        def run():
            latent, self.records[name] = self.engine.sample(experts, self.schedule, self.positive, self.negative,
                                                            self.latent, self.seed, self.cfg)
            return latent["samples"]
        return run

    def native(self, easycache: bool = False, patch=None):
        """`patch(role, MODEL) -> MODEL`: a node put on each expert before its ModelSamplingSD3, where the
        template's graph would have a cache node (Wan2.2 Cache-DiT (MODEL), EasyCache, LazyCache)."""
        import comfy_extras.nodes_easycache as easy
        import nodes

        models = self.models if patch is None else {role: patch(role, m) for role, m in self.models.items()}
        models = {role: self.engine.shifted(m, self.flow_shift) for role, m in models.items()}
        if easycache:
            defaults = {i.id: i.default for i in easy.EasyCacheNode.define_schema().inputs if i.id != "model"}
            models = {role: easy.EasyCacheNode.execute(m, **defaults).args[0] for role, m in models.items()}
        switch = self.schedule.high_steps
        common = (self.seed, self.steps)

        def run():
            first = nodes.common_ksampler(models["high"], *common, self.cfg["high"], self.sampler, self.scheduler,
                                          self.positive, self.negative, self.latent, denoise=1.0, disable_noise=False,
                                          start_step=0, last_step=switch, force_full_denoise=False)[0]
            return nodes.common_ksampler(models["low"], *common, self.cfg["low"], self.sampler, self.scheduler,
                                         self.positive, self.negative, first, denoise=1.0, disable_noise=True,
                                         start_step=switch, last_step=10000, force_full_denoise=True)[0]["samples"]
        return run
