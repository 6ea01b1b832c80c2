"""The stage observer: a cache on ComfyUI's own Wan model, for one expert's stage of one run.

The diffusion model is shared by every clone of a MODEL (other branches, native nodes downstream), so
nothing of the cache may outlive the stage. Like ComfyUI's own EasyCache, everything goes through
wrappers on the stage's own clone: the cache is installed when the stage's sampling starts (after
ComfyUI has loaded and patched the weights) and removed when it ends, also after an error or an
interrupt. The observer decides when; the cache itself (cache-dit) is driven through one module,
cache_dit_backend.py, and knows nothing of stages.

What the cache must know about the stage it learns from the calls its wrappers see, never from a copy of
ComfyUI's own rules: the prompts at its first evaluation, and how ComfyUI batches them at its first transformer
call; the evaluations and calls it reports are the stage's StageCalls' (stage_calls.py), counted once. What it
saw first must hold for the whole stage. The same lifecycle serves the pack's sampler (one StageCache per stage)
and the Cache-DiT MODEL node (one StageCache on the MODEL, reset at each sample call: each KSampler's call is a
stage).
"""

from __future__ import annotations

import logging

import comfy.patcher_extension

from . import cache_dit_backend, stage_parts, vace_hints
from .attention_route import RouteFollow
from .block_forwards import SwappedForwards
from .cache_memory import CacheMemory
from .cache_miss import ErrorCriterion
from .core import cache as core
from .core.errors import Wan22InputError
from .core.schedule import STAGE_WORDS
from .stage_calls import StageCalls
from .wrapper_calls import PROMPT_NAMES, call_argument, prompt_indices

KEY = "wan22_cache_dit"
WrappersMP = comfy.patcher_extension.WrappersMP
TURN_OFF = "set enabled to false on the Wan2.2 Cache-DiT node"
CARRIERS = {"lead": "lead stage's high-noise expert", "high": "high-noise expert", "low": "low-noise expert",
            "model": "MODEL"}


# While cache-dit runs a call, ComfyUI's Wan block loop sees one block (cache-dit's, which runs the real ones): the
# index and count it puts in transformer_options would read 0 and 1, and the per-block patches it applies by index
# would apply to the whole stack or not at all. The cached loop gives every block its own (indexed_forward): the
# replace patches (patches_replace dit double_block i) are moved out of that loop's sight, to this key, for the
# blocks to apply themselves.
BLOCK_REPLACE = "wan22_block_replace"
HONOURED = "double_block"  # the replace patches a block can apply alone: they need only its index and arguments


def replace_patches(transformer_options: dict) -> dict:
    return transformer_options.get("patches_replace", {}).get("dit", {})


def block_patches(transformer_options: dict) -> list[str]:
    """The per-block patches that the cached loop cannot honour: ComfyUI's `double_block` patches, which take
    the model's input and its unmodulated timestep embedding beside the block's output (nothing a block call
    carries), and replace patches of other kinds than a Wan block's."""
    found = [f"patches_replace dit {kind} {index}" for kind, index in replace_patches(transformer_options)
             if kind != HONOURED]
    found += [f"patches {kind}" for kind in transformer_options.get("patches", {}) if kind == "double_block"]
    return found


def block_patch_error(found: list[str], why: str, stage: str, turn_off: str) -> Wan22InputError:
    return Wan22InputError("enabled", f"the {CARRIERS[stage]} carries per-block model patches ({', '.join(found[:3])})"
                                      f"{why}: {turn_off}, or remove the node that patches the model's blocks")


def refuse_block_patches(transformer_options: dict, stage: str, turn_off: str = TURN_OFF) -> None:
    found = block_patches(transformer_options)
    if found:
        raise block_patch_error(found, " that Wan2.2 Cache-DiT's cached block loop cannot apply", stage, turn_off)


def replaced_blocks(transformer_options: dict) -> tuple:
    return tuple(sorted(index for kind, index in replace_patches(transformer_options) if kind == HONOURED))


def indexed_forward(i: int, total: int, inner):
    """Block i's forward while a stage is cached: it runs as it runs in ComfyUI's own block loop, with its index
    and the block count in transformer_options (attention overrides and block patches read them), and through
    its replace patch when it has one, called the way that loop calls it (the patch gets the block's arguments
    and the original block). Only the blocks cache-dit computes are called, so a patch applies on every
    computed block and on none of the skipped ones, as every other part of them."""
    def forward(x, *args, transformer_options=None, **kwargs):
        options = {} if transformer_options is None else transformer_options
        options["block_index"], options["total_blocks"] = i, total
        replace = options.get(BLOCK_REPLACE, {}).get((HONOURED, i))
        if replace is None:
            return inner(x, *args, transformer_options=options, **kwargs)
        context_img_len = kwargs.get("context_img_len")

        def original_block(a):
            return {"img": inner(a["img"], context=a["txt"], e=a["vec"], freqs=a["pe"],
                                 context_img_len=context_img_len, transformer_options=a["transformer_options"])}
        return replace({"img": x, "txt": kwargs["context"], "vec": kwargs["e"], "pe": kwargs["freqs"],
                        "transformer_options": options}, {"original_block": original_block})["img"]
    return forward


def hide_replace_patches(options: dict) -> None:
    """Moves the Wan block replace patches of one transformer call (its own transformer_options, copied per
    call by ComfyUI) from the block loop's sight to the blocks' (indexed_forward)."""
    replace = options.get("patches_replace", {})
    if "dit" in replace:
        options[BLOCK_REPLACE] = replace["dit"]
        options["patches_replace"] = {kind: value for kind, value in replace.items() if kind != "dit"}


def sharing_parts(model_options: dict) -> list[str]:
    """What else on the sampled MODEL runs the expert in a way a Cache-DiT context cannot follow, each named
    for the user: another cache (ComfyUI's EasyCache and LazyCache skip whole model calls by their own
    measure, so cache-dit would compare steps that are not neighbours, or cache on top of a cache), context
    windows (each frame window is one more call of the same step: cache-dit would compare one window's
    residual with another's) and the MultiGPU CFG split (its clones run some prompts on other devices,
    uncached, in threads)."""
    options = model_options.get("transformer_options", {})
    keys = {key for by_key in options.get("wrappers", {}).values() for key in by_key}
    found = []
    if "easycache" in options or keys & {"easycache", "lazycache"}:
        found.append("ComfyUI's EasyCache or LazyCache (another cache on the same expert)")
    if model_options.get("context_handler") is not None:
        found.append("context windows (a Context Windows node; each frame window is another call of every step)")
    if len(model_options.get("multigpu_clones") or {}) > 1:
        found.append("the MultiGPU CFG Split (its clones run some prompts on other devices, uncached)")
    return found


def describe_calls(calls) -> str:
    return "; ".join("+".join(PROMPT_NAMES.get(i, str(i)) for i in call) or "unmarked" for call in calls)


class StageCache:
    """A cache (cache-dit's DBCache: `backend`, cache_dit_backend.py) on one expert's diffusion model
    for exactly one stage, with a context of its own that lives as long as the stage; the stage's statistics
    once it has run.

    `cfg_batching` is how the prompts of one evaluation reach the transformer, as first seen:
    - "single": one prompt (CFG 1), one call per evaluation;
    - "batched": all prompts in one call, as ComfyUI runs them when memory allows: one cache step per call;
    - "separate": one call per prompt, as ComfyUI runs them when memory is short: cache-dit's separate CFG
      then keeps a residual stream per prompt, in the order ComfyUI calls them (`pass_order`).
    A stage whose prompts or batching change after that is stopped rather than cached wrongly."""

    backend = cache_dit_backend  # the cache method: the one module that talks to it (a test swaps in a double)

    def __init__(self, plan: core.CachePlan, role: str, stage: str | None = None, turn_off: str = TURN_OFF,
                 calls: StageCalls | None = None, share: float = 0.5):
        self.plan, self.role, self.stage = plan, role, stage or role  # role: the expert whose settings apply
        self.share = share  # the stage's share of the plan's error target (the error criterion)
        self.turn_off = turn_off  # what the user can do when the cache cannot follow a stage
        # what the stage's sampling does, counted once: the engine's StageCalls, or one of the cache's own
        self.own_calls = calls is None
        self.calls = StageCalls(self.stage) if calls is None else calls
        self.memory = CacheMemory(plan, role)  # the bytes it will hold, told to ComfyUI's memory management
        self._reset()

    def _reset(self) -> None:
        self.cfg_batching = None
        self.pass_order: tuple[str, ...] = ()
        self.prompts = None  # the prompts present in an evaluation, as the first one had them
        self.replaced = None  # the blocks with a replace patch, as the first evaluation had them
        self.pattern = None  # the prompts of each transformer call of the first evaluation
        self.calls_now = None  # ... of the evaluation in progress (None outside an evaluation)
        self.diffusion_model = None
        self.installed = False
        self.parts = []  # what the stage installed on the expert (stage_parts.py), in order, while it runs
        self.statistics_of_parts = {}  # ... their entries in the report, once the stage has run
        self.block_count = None  # the part that counts the blocks that ran
        self.outcome = None  # what the cache did, once the stage has run
        self.held = None  # the tensors it held at the stage's end: {"bytes", "devices"}
        self.allowance = None  # the error criterion's share of the target, while the stage is cached by it

    def attach(self, model) -> None:
        """Adds the wrappers to `model`, the stage's own clone (never a MODEL the pack received)."""
        refuse_block_patches(model.model_options.get("transformer_options", {}), self.stage, self.turn_off)
        if self.own_calls:
            self.calls.attach(model)
        self.memory.attach(model)
        model.add_wrapper_with_key(WrappersMP.SAMPLER_SAMPLE, KEY, self.sampler_sample)
        model.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, KEY, self.calc_cond_batch)
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, KEY, self.diffusion_model_call)

    # --- the stage's sample call: install, run, remove ---

    def sampler_sample(self, executor, *args, **kwargs):
        # Installed here, not around the whole sampling: ComfyUI has loaded and patched the weights by now,
        # and unpatches them by their block names after this returns.
        self._reset()
        guider = call_argument(executor, args, kwargs, "model_wrap")
        sharing = sharing_parts(getattr(guider, "model_options", {}))
        if sharing:
            raise Wan22InputError("enabled", f"the {CARRIERS[self.stage]} is also run by {'; '.join(sharing)}, "
                                             f"which Cache-DiT cannot share a stage with: {self.turn_off}, or remove "
                                             "that node")
        self.diffusion_model = guider.model_patcher.model.diffusion_model
        if self.backend.is_cached(self.diffusion_model):  # another of our caches on the same expert runs it
            # named by the input of the node whose sampling meets both (the pack's sampler, or a KSampler)
            raise Wan22InputError("model" if self.stage == "model" else "experts",
                                  f"the {CARRIERS[self.stage]} is already cached by another Cache-DiT node in this "
                                  "sampling (a Wan2.2 Cache-DiT (MODEL) node and the Wan2.2 Cache-DiT node on one "
                                  "expert?): keep one of them")
        # A stage capped at 0 cached evaluations, or with an error target of 0, runs without the cache, and its
        # report says why (core.skip_note).
        self.installed = self.plan.caches(self.role)
        self.block_count = stage_parts.BlockCount(self.diffusion_model.blocks)
        failed = True
        try:
            parts = self.parts_for(guider) if self.installed else []
            stage_parts.install_all(parts + [self.block_count], self.parts)
            out = executor(*args, **kwargs)
            if self.installed:
                self.outcome = self.backend.outcome(self.diffusion_model)
                for part in parts:
                    self.outcome = part.outcome(self.outcome)
                self.held = stage_parts.held_together(parts)
            self.statistics_of_parts = {k: v for part in parts for k, v in part.statistics().items()}
            failed = False
            return out
        finally:
            installed, self.parts = self.parts, []

            def removal_failed(error: Exception) -> None:
                if not failed:
                    raise error
                # the stage's own error is the one the user needs: this one goes to the log only
                logging.error("Wan2.2 Cache-DiT: removing the cache after the %s stage's error also failed",
                              STAGE_WORDS[self.stage], exc_info=error)

            stage_parts.remove_all(installed, removal_failed)

    def parts_for(self, guider) -> list:
        """What this stage installs on its expert, in order (stage_parts.py): VACE-Fun's hints where the model
        has VACE blocks, cache-dit, the indexed forwards, the calibrator's route where the plan forecasts, the
        error criterion where the plan asks for it."""
        model, plan, separate = self.diffusion_model, self.plan, lambda: self.cfg_batching == "separate"
        options = getattr(guider, "model_options", {}).get("transformer_options", {})
        parts = [vace_hints.for_stage(model, plan, options, self.refuse),
                 stage_parts.CacheDiT(self.backend, model, plan, self.role),
                 SwappedForwards(model.blocks, indexed_forward)]
        if plan.calibrator != "none":
            parts.append(RouteFollow(self.backend, model, plan, self.role, separate))
        if plan.criterion == "error":
            self.allowance = core.stage_allowance(plan, self.role, self.share)
            parts.append(ErrorCriterion(self.backend, model, self.allowance, getattr(guider, "cfg", 1.0),
                                        guider.model_patcher.model.latent_format, separate))
        return [part for part in parts if part is not None]

    def refuse(self, what: str) -> Wan22InputError:
        """The error for an expert this stage cannot cache."""
        return Wan22InputError("enabled", f"the {CARRIERS[self.stage]} is {what}: {self.turn_off}")

    # --- one evaluation: the prompts it carries must be those of the first one ---

    def calc_cond_batch(self, executor, *args, **kwargs):
        conds = call_argument(executor, args, kwargs, "conds")
        model_options = call_argument(executor, args, kwargs, "model_options")
        options = model_options.get("transformer_options", {})
        refuse_block_patches(options, self.stage, self.turn_off)
        replaced = replaced_blocks(options)
        if self.replaced is None:
            self.replaced = replaced
        elif replaced != self.replaced:
            raise block_patch_error([f"patches_replace dit {HONOURED} {i}" for i in replaced or self.replaced],
                                    " on some of its evaluations only (a guidance node that runs the model again "
                                    "with blocks replaced, as Skip Layer Guidance does), which the cache would mix "
                                    "with the others", self.stage, self.turn_off)
        present = tuple(i for i, cond in enumerate(conds) if cond is not None)
        if self.prompts is None:
            self.prompts = present
        elif present != self.prompts:
            raise self.changed(f"an evaluation with the prompts {describe_calls([present])} where the stage began "
                               f"with {describe_calls([self.prompts])} (a guidance node that runs the model again?)")
        self.calls_now = []
        for part in self.parts:
            part.begin_evaluation()
        out = executor(*args, **kwargs)
        for part in self.parts:
            part.end_evaluation()
        calls, self.calls_now = tuple(self.calls_now), None
        if self.pattern is None:
            if len(calls) != (2 if self.cfg_batching == "separate" else 1):
                raise self.entries_or(calls, f"its first step reached the transformer as {describe_calls(calls)}, "
                                             "which Cache-DiT cannot pair with its steps")
            self.pattern = calls
        return out

    # --- one transformer call: the batching is fixed by the first call ---

    def diffusion_model_call(self, executor, *args, **kwargs):
        options = call_argument(executor, args, kwargs, "transformer_options")
        refuse_block_patches(options, self.stage, self.turn_off)  # patches that come with a prompt's conditioning
        if self.installed:
            hide_replace_patches(options)
        order = prompt_indices(options)
        calls = self.calls_now
        if calls is None:
            raise self.changed("a transformer call outside ComfyUI's evaluation of the prompts")
        if self.pattern is not None:
            fits = len(calls) < len(self.pattern) and order == self.pattern[len(calls)]
        else:
            if not calls:
                self.decide_batching(order)
            fits = (not calls if self.cfg_batching != "separate" else
                    len(order) == 1 and order[0] in self.prompts and all(order != c for c in calls))
        if not fits:
            raise self.entries_or(calls + [order], f"a call with {describe_calls([order])} after "
                                                   f"{describe_calls(calls) or 'none'} in this step, where its first "
                                                   f"step had {describe_calls(self.pattern or calls)} (ComfyUI "
                                                   "batches the prompts by free memory, which changed)")
        calls.append(order)
        call = stage_parts.Call(order, len(calls) == 1, options,
                                lambda name: call_argument(executor, args, kwargs, name))
        for part in self.parts:
            part.before(call)
        try:
            out = executor(*args, **kwargs)
        finally:
            for part in reversed(self.parts):
                part.done(call)
        for part in self.parts:
            part.after(call, out)
        return out

    def decide_batching(self, order: tuple[int, ...]) -> None:
        if set(order) == set(self.prompts):
            self.cfg_batching = "single" if len(self.prompts) == 1 else "batched"
            self.pass_order = tuple(PROMPT_NAMES.get(i, str(i)) for i in order)
        elif len(self.prompts) == 2 and len(order) == 1 and order[0] in self.prompts:
            self.cfg_batching = "separate"
            first, second = order[0], next(i for i in self.prompts if i != order[0])
            self.pass_order = (PROMPT_NAMES[first], PROMPT_NAMES[second])
            # cache-dit's separate CFG keeps one residual stream for the even calls and one for the odd ones,
            # each with its own difference (cfg_diff_compute_separate), so it pairs ComfyUI's calls as they come.
            if self.installed:
                self.backend.refresh(self.diffusion_model, self.plan, self.role, separate_cfg=True)
        else:
            raise self.changed(f"its first call carried {describe_calls([order])} of the prompts "
                               f"{describe_calls([self.prompts])}")

    def entries_or(self, calls, what: str) -> Wan22InputError:
        """The error for calls that do not fit the stage's pattern. A prompt whose conditioning has several
        entries (ConditioningCombine, ConditioningSetTimestepRange pairs, areas) reaches the transformer as
        one batch chunk per entry: the cache follows it while ComfyUI batches all of them in one call each
        step, and the error names that, not memory, when it does not."""
        seen = [index for call in calls for index in call]
        first = [index for call in (self.pattern or ()) for index in call]
        several = sorted({PROMPT_NAMES.get(i, str(i)) for i in seen + first if seen.count(i) > 1 or first.count(i) > 1})
        if not several:
            return self.changed(what)
        entries = " and ".join(f"the {name} prompt's" for name in several)
        return Wan22InputError("enabled", f"Cache-DiT cannot follow the {STAGE_WORDS[self.stage]} stage: "
                                          f"{entries} conditioning has several entries (ConditioningCombine, "
                                          "ConditioningSetTimestepRange ranges that overlap, areas or masks, or "
                                          "texts of lengths ComfyUI cannot batch), which reached the transformer "
                                          f"as {describe_calls(calls)} in one step. The cache follows several "
                                          "entries only while each step runs them in one call: give each prompt "
                                          f"one conditioning per step, or {self.turn_off}")

    def changed(self, what: str) -> Wan22InputError:
        return Wan22InputError("enabled", f"Cache-DiT cannot follow the {STAGE_WORDS[self.stage]} stage: it saw "
                                          f"{what}. Run the prompt again, or {self.turn_off}")

    def statistics(self, layers: int) -> dict:
        """The stage's entry in a report, once it has run."""
        seen = core.StageSeen(evaluations=self.calls.evaluations, calls=self.calls.calls,
                              cfg_batching=self.cfg_batching, pass_order=self.pass_order,
                              block_forwards=self.block_count.count if self.block_count else 0,
                              config=self.backend.describe(self.plan, self.role, self.cfg_batching == "separate"))
        stats = core.statistics(self.plan, self.role, seen, self.outcome or self.backend.NOTHING, layers,
                                self.allowance.estimate() if self.allowance is not None else None)
        stats["cached"] = self.installed  # False: the stage ran without the cache (its note says why)
        stats["held_bytes"] = self.held["bytes"] if self.held else 0
        stats["memory_asked_bytes"] = self.memory.asked or 0  # what ComfyUI was told to make room for
        stats["held_on"] = self.held["devices"] if self.held else []
        stats.update(self.statistics_of_parts)  # e.g. VACE-Fun's hints, a calibrator's fresh forecasts
        return stats
