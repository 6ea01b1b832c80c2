"""Runs on the trained test bed (devtools/testbed/): its two experts loaded by ComfyUI's own loader into a
ComfyUI in this process, sampled through the official template's graph of ComfyUI's own nodes (per expert
MODEL -> [cache node] -> ModelSamplingSD3 -> KSamplerAdvanced: high from step 0 to the switch with its leftover
noise, low from the switch to the end), or through the pack's sampler, with a class's prompt and the negative
as the bed's data world defines them."""

from __future__ import annotations

import torch

_HARNESS = {}  # one ComfyUI per process (ComfyUI's server and node registry are process-wide)


def harness(base: str):
    from devtools.comfy_inprocess import InProcessComfy

    if "comfy" not in _HARNESS:
        _HARNESS["comfy"] = InProcessComfy(base)
        import comfy.utils

        comfy.utils.set_progress_bar_enabled(False)
    return _HARNESS["comfy"]


def vace_conditioning(latent_format, control: torch.Tensor) -> dict:
    """A VACE bed's control (testbed.World.control: in the space the transformer sees) as WanVaceToVideo puts it
    on both prompts: the 32 channels of frames as a VAE gives them (ComfyUI's VACE model takes each 16 through
    process_in), the 64 of the mask as they are, strength 1."""
    frames = torch.cat([latent_format.process_out(control[None, i:i + 16]) for i in (0, 16)], dim=1)
    return {"vace_frames": [frames], "vace_mask": [control[None, 32:]], "vace_strength": [1.0]}


class BedRuns:
    """The bed's experts (role -> MODEL, loaded once) and the runs a benchmark makes on them; `world`, the bed's
    data world (testbed.World, handed in: this module never imports the bed script), gives each class's prompt."""

    def __init__(self, base: str, bed, world):
        self.bed = bed
        self.comfy = harness(base)
        import comfy.sd

        key = ("models", bed.folder)
        if key not in _HARNESS:
            _HARNESS[key] = {role: comfy.sd.load_diffusion_model(path) for role, path in bed.files.items()}
        self.models = _HARNESS[key]  # role -> MODEL: high and low, or a single transformer's ("single")
        self.single = bed.config.single
        self.world = world
        self.engine = self.comfy.pack("nodes.engine")
        # the pack's handle: a single transformer in the high-noise input, where it takes every step
        self.experts = self.comfy.pack("nodes.expert_models").experts_handle(
            {"high": next(iter(self.models.values()))} if self.single else self.models)

    def latent(self, size: tuple[int, int] | None = None) -> dict:
        """The empty latent of a size the bed was trained at (its measured size by default)."""
        return {"samples": torch.zeros(self.bed.config.latent(size))}

    def schedule(self, run: dict):
        return self.comfy.pack("nodes.sigmas").build_schedule(
            has_high=True, has_low=not self.single, model_default=self.experts.default_boundary, sampler=run["sampler"],
            scheduler=run["scheduler"], steps=run["steps"], flow_shift=run["flow_shift"])

    def conditioning(self, cls: int, control: torch.Tensor | None = None) -> tuple[list, list]:
        extra = {} if control is None else self.vace(control)
        return [[self.world.context(cls), dict(extra)]], [[self.world.context(None), dict(extra)]]

    def vace(self, control: torch.Tensor) -> dict:
        return vace_conditioning(next(iter(self.models.values())).model.latent_format, control)

    def run(self, run: dict, seed: int, cls: int, patch=None, size: tuple[int, int] | None = None,
            control: torch.Tensor | None = None) -> torch.Tensor:
        """The final latent of the template's graph (`patch(role, MODEL) -> MODEL`: a cache node on each expert,
        where the template's graph would have it); `control`: a VACE bed's (WanVaceToVideo's conditioning)."""
        import nodes

        models = self.models if patch is None else {role: patch(role, m) for role, m in self.models.items()}
        models = {role: self.engine.shifted(m, run["flow_shift"]) for role, m in models.items()}
        positive, negative = self.conditioning(cls, control)
        common = (seed, run["steps"])
        if self.single:  # TI2V-5B's graph: one KSampler over every step, at the run's (high) CFG
            return nodes.common_ksampler(models[next(iter(models))], *common, run["cfg"]["high"], run["sampler"],
                                         run["scheduler"], positive, negative, self.latent(size))[0]["samples"]
        switch = self.schedule(run).high_steps
        first = nodes.common_ksampler(models["high"], *common, run["cfg"]["high"], run["sampler"], run["scheduler"],
                                      positive, negative, self.latent(size), denoise=1.0, disable_noise=False,
                                      start_step=0, last_step=switch, force_full_denoise=False)[0]
        return nodes.common_ksampler(models["low"], *common, run["cfg"]["low"], run["sampler"], run["scheduler"],
                                     positive, negative, first, denoise=1.0, disable_noise=True, start_step=switch,
                                     last_step=10000, force_full_denoise=True)[0]["samples"]

    def model_space(self, latent: torch.Tensor) -> torch.Tensor:
        """A latent as the transformer sees it (Wan21.process_in): where the bed's data and templates live."""
        return next(iter(self.models.values())).model.latent_format.process_in(latent)

    def ours(self, run: dict, seed: int, cls: int, plan=None, size: tuple[int, int] | None = None,
             control: torch.Tensor | None = None):
        """The pack's two-stage sampler on the bed: (final latent, run record)."""
        positive, negative = self.conditioning(cls, control)
        experts = self.experts.replace(cache_plan=plan)
        latent, record = self.engine.sample(experts, self.schedule(run), positive, negative, self.latent(size), seed,
                                            dict(run["cfg"]))
        return latent["samples"], record

