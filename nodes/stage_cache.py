"""Cache-DiT on ComfyUI's own Wan model, for one expert's stage of one run.

The diffusion model is shared by every clone of a MODEL (other branches, native nodes downstream), so
nothing of cache-dit may outlive the stage. Like ComfyUI's own EasyCache, everything goes through
wrappers on the stage's own clone: cache-dit is installed when the stage's sampling starts (after
ComfyUI has loaded and patched the weights) and removed when it ends, also after an error or an
interrupt. Each of cache-dit's traps that this avoids is marked where it does.
"""

from __future__ import annotations

import torch

import comfy.patcher_extension

from .core import cache as core
from .core.errors import Wan22InputError
from .core.experts import ROLE_WORDS
from .core.logs import quiet_cache_dit

KEY = "wan22_cache_dit"
WrappersMP = comfy.patcher_extension.WrappersMP


def block_patches(transformer_options: dict) -> list[str]:
    """The per-block patches that ComfyUI's Wan block loop would apply. While cache-dit runs, it swaps the
    model's block list for one wrapper, so that loop sees a single block and these would silently stop
    applying: they are refused instead."""
    replaced = transformer_options.get("patches_replace", {}).get("dit", {})
    found = [f"patches_replace dit {kind} {index}" for kind, index in replaced]
    found += [f"patches {kind}" for kind in transformer_options.get("patches", {}) if kind == "double_block"]
    return found


def refuse_block_patches(transformer_options: dict, role: str) -> None:
    found = block_patches(transformer_options)
    if found:
        raise Wan22InputError("enabled", f"the {ROLE_WORDS[role]} expert carries per-block model patches "
                                         f"({', '.join(found[:3])}) that Wan2.2 Cache-DiT's cached block loop would "
                                         "drop: set enabled to false on the Wan2.2 Cache-DiT node, or remove the "
                                         "node that patches the model's blocks")


class StageCache:
    """cache-dit on one expert's diffusion model for exactly one stage, with a context of its own sized with
    that stage's evaluations; `summary` holds cache-dit's own statistics once the stage has run.

    How the conditional and unconditional passes reach the model decides how cache-dit must count them:
    - "single": CFG 1, one pass per evaluation;
    - "batched": both passes in one call, as ComfyUI runs them when memory allows: one step per call;
    - "separate": memory is short, so ComfyUI would call them one after the other, unconditional first;
      they are then called conditional first (what cache-dit's separate CFG expects), whatever ComfyUI's
      batching would do step by step.
    The mode is fixed when the stage starts, with ComfyUI's own batching rule; a stage whose batching
    changes on the way is stopped rather than cached wrongly."""

    def __init__(self, plan: core.CachePlan, role: str, per_step: list[int], uncond: bool):
        """`per_step`: the transformer evaluations of each step of the stage; `uncond`: whether ComfyUI
        evaluates the negative prompt too."""
        self.plan, self.role, self.per_step, self.uncond = plan, role, per_step, uncond
        self.evaluations = sum(per_step)
        self.passes = "single"
        self.config = None
        self.block_forwards = 0
        self.summary = None

    def attach(self, model) -> None:
        """Adds the wrappers to `model`, the stage's own clone (never a MODEL the pack received)."""
        refuse_block_patches(model.model_options.get("transformer_options", {}), self.role)
        model.add_wrapper_with_key(WrappersMP.SAMPLER_SAMPLE, KEY, self.sampler_sample)
        model.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, KEY, self.calc_cond_batch)
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, KEY, self.diffusion_model)

    def sampler_sample(self, executor, guider, sigmas, extra_args, callback, noise, *args, **kwargs):
        # Installed here, not around the whole sampling: ComfyUI has loaded and patched the weights by now,
        # and unpatches them by their block names after this returns.
        if self.uncond:
            self.passes = "batched" if batch_fits(guider, noise, chunks=2) else "separate"
        self.config = self.plan.db_cache_config(self.role, self.evaluations, separate_cfg=self.passes == "separate")
        diffusion_model = guider.model_patcher.model.diffusion_model
        counters = []
        try:
            install(diffusion_model, self.config, self.plan.calibrator_config())
            counters = [block.register_forward_hook(self.count_block) for block in diffusion_model.blocks]
            out = executor(guider, sigmas, extra_args, callback, noise, *args, **kwargs)
            self.summary = summary_of(diffusion_model)
            return out
        finally:
            for counter in counters:
                counter.remove()
            remove(diffusion_model)

    def count_block(self, _module, _args, _output):
        self.block_forwards += 1

    def calc_cond_batch(self, executor, model, conds, x_in, timestep, model_options):
        refuse_block_patches(model_options.get("transformer_options", {}), self.role)
        present = [i for i, c in enumerate(conds) if c is not None]
        if len(present) != (2 if self.uncond else 1):
            raise Wan22InputError("enabled", f"something calls the {ROLE_WORDS[self.role]} expert with "
                                             f"{len(present)} prompt(s) where its sampler evaluates "
                                             f"{2 if self.uncond else 1} (a guidance node or model patch that runs "
                                             "the model again?), so its Cache-DiT context cannot be sized to the "
                                             "run: set enabled to false on the Wan2.2 Cache-DiT node, or remove that "
                                             "node")
        if self.passes != "separate":
            return executor(model, conds, x_in, timestep, model_options)
        out = [torch.zeros_like(x_in) for _ in conds]
        for i in present:  # conds[0] is the conditional prompt: it goes first
            alone = [c if j == i else None for j, c in enumerate(conds)]  # keeps each pass's cond_or_uncond
            out[i] = executor(model, alone, x_in, timestep, model_options)[i]
        return out

    def diffusion_model(self, executor, *args, **kwargs):
        options = transformer_options(args, kwargs)
        refuse_block_patches(options, self.role)  # patches that come with a prompt's conditioning
        if prompts_in(options) != (2 if self.passes == "batched" else 1):
            raise Wan22InputError("enabled", f"ComfyUI changed how it batches the prompts in the middle of the "
                                             f"{ROLE_WORDS[self.role]} stage (its free memory changed), so Cache-DiT "
                                             "would pair the wrong passes: run the prompt again, or set enabled to "
                                             "false on the Wan2.2 Cache-DiT node")
        return executor(*args, **kwargs)


def transformer_options(args, kwargs) -> dict:
    """The transformer options of a call to ComfyUI's WanModel.forward(x, timestep, context, clip_fea,
    time_dim_concat, transformer_options, ...), as a diffusion-model wrapper receives it."""
    return args[5] if len(args) > 5 else kwargs.get("transformer_options", {})


def prompts_in(options: dict) -> int:
    """How many prompts (conditional, unconditional) a call with these transformer options carries."""
    return len(options.get("cond_or_uncond", ())) or 1


def batch_fits(guider, noise, chunks: int) -> bool:
    """ComfyUI's own rule (comfy.samplers._calc_cond_batch) for whether `chunks` prompts go in one call."""
    shape = [chunks * noise.shape[0]] + list(noise.shape[1:])
    model = guider.inner_model
    return model.memory_required(shape) * 1.5 < guider.model_patcher.get_free_memory(noise.device)


def install(diffusion_model, config, calibrator_config) -> None:
    import cache_dit
    from cache_dit import BlockAdapter, ForwardPattern

    with quiet_cache_dit():
        # Pattern_3: ComfyUI's Wan blocks take x and return x (context, e, freqs as keyword arguments).
        adapter = BlockAdapter(transformer=diffusion_model, blocks=diffusion_model.blocks,
                               forward_pattern=ForwardPattern.Pattern_3, check_forward_pattern=False)
        cache_dit.enable_cache(adapter, cache_config=config, calibrator_config=calibrator_config)


def remove(diffusion_model) -> None:
    """Unhooks the model completely: its output is then bit-identical to a model never cached."""
    import cache_dit
    from cache_dit.caching.block_adapters import BlockAdapter

    if BlockAdapter.is_cached(diffusion_model):
        with quiet_cache_dit():
            cache_dit.disable_cache(diffusion_model)
    # disable_cache leaves `forward` as an instance attribute bound to the class's own forward: drop it, so
    # the shared model is exactly as ComfyUI built it.
    forward = vars(diffusion_model).get("forward")
    if forward is not None and getattr(forward, "__func__", None) is type(diffusion_model).forward:
        del diffusion_model.forward


def summary_of(diffusion_model):
    import cache_dit

    summaries = [s for s in cache_dit.summary(diffusion_model, details=False, logging=False) if s.cache_options]
    return summaries[0] if summaries else None
