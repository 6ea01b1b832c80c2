"""What a built bed generates, through ComfyUI's own two-KSamplerAdvanced graph: how well each sample fits the
nearest data template (relative L2: clean data about 0.05, noise 1.0) and whether its class is the one asked for,
at each size the bed was trained at; on a VACE bed, how well it follows the control."""

from __future__ import annotations

import tempfile

import torch

from devtools.testbed.world import World


GENERATION_RUN = {"sampler": "uni_pc", "scheduler": "simple", "steps": 20, "flow_shift": 8.0,
                  "cfg": {"high": 4.0, "low": 4.0}}


def evaluate(bed, log=print, samples: int = 8) -> dict:
    """At each size the bed (build.Bed) was trained at, samples one latent per class (seeds 1..8) through ComfyUI's
    two-KSamplerAdvanced graph at CFG 4 and fits each to the nearest data template: the fit (relative L2), the
    class it shows, and clean data's fit beside it. The measured size's figures lead."""
    from devtools.bed_runs import BedRuns

    config = bed.config
    world = World(config)
    per_size = {}
    with tempfile.TemporaryDirectory(prefix="wan22-testbed-eval-") as base:
        runs = BedRuns(base, bed, world)
        for size in config.sizes:
            fits = []
            for i in range(samples):
                cls = i % len(world.classes)
                start = control_start(world, i, cls, size) if config.vace else None
                control = None if start is None else world.control(cls, *start, *size)
                latent = runs.run(GENERATION_RUN, seed=i + 1, cls=cls, size=size, control=control)
                fit = world.fit(runs.model_space(latent)[0])
                fits.append({"seed": i + 1, "class": cls, **fit, "right": fit["class"] == cls})
                if start is not None:
                    fits[-1].update(control_start=list(start), **world.track_fidelity(fit, cls, start, *size))
            clean, _ = world.sample(samples, torch.Generator().manual_seed(7), size)
            clean_fits = [world.fit(x)["rel_l2"] for x in clean]
            per_size["x".join(map(str, size))] = {
                "samples": fits, "template_fit_mean": sum(f["rel_l2"] for f in fits) / len(fits),
                "template_fit_max": max(f["rel_l2"] for f in fits),
                "class_right": sum(f["right"] for f in fits), "of": len(fits),
                "clean_data_fit_mean": sum(clean_fits) / len(clean_fits)}
            if config.vace:
                per_size["x".join(map(str, size))]["fidelity_mean"] = sum(f["fidelity"] for f in fits) / len(fits)
    measured = per_size["x".join(map(str, config.measured))]
    out = {"run": GENERATION_RUN, "size": list(config.measured), **measured}
    if len(per_size) > 1:
        out["sizes"] = {size: {k: v for k, v in figures.items() if k != "samples"}
                        for size, figures in per_size.items()}
    vace = f", the control's track followed at {out['fidelity_mean']:.2f} (fidelity)" if config.vace else ""
    log(f"[testbed] {bed.name}: samples fit a template at {out['template_fit_mean']:.3f} (mean; clean data "
        f"{out['clean_data_fit_mean']:.3f}), class right in {out['class_right']} of {out['of']}{vace}")
    return out


def control_start(world: World, i: int, cls: int, size: tuple[int, int]) -> tuple[int, int]:
    """The start a VACE control puts sample `i` of class `cls` at: spread over the class's starts, fixed."""
    starts = world.starts(cls, *size)
    return starts[(7 * i + 3) % len(starts)]
