"""Wan2.2 Cache-DiT: puts a cache plan on a new experts handle; the sampler applies it to each expert's
stage of each run, with a context of that stage's own. Wan2.2 Cache-DiT (MODEL): the same cache on one
expert's MODEL, for graphs of ComfyUI's own samplers, with a context of its own for each sample call."""

from __future__ import annotations

import logging

from comfy_api.latest import io

from . import cache_dit_backend
from .core.architecture import UNCACHED_HINT, between_blocks
from .core.cache import (CALIBRATORS, CRITERIA, HELD_PER_STREAM, MODEL_SHARE, SAVED_CRITERION, CachePlan,
                         ExpertCacheSettings)
from .core.errors import Wan22InputError
from .core.experts import ROLE_WORDS
from .core.report import blocks_saved
from .stage_cache import StageCache
from .types import CATEGORY, ExpertsType, linked_given, linked_only

NO_LIMIT = "-1 means no limit."
PASSES_NOTE = "CFG passes (batched or separate) are read from ComfyUI's calls when each stage runs"
DEFAULTS = CachePlan().node_inputs()


def block_inputs() -> list:
    """The inputs both Cache-DiT nodes share: what decides, block by block, whether a step is cached."""
    return [
        io.Float.Input("residual_diff_threshold", default=DEFAULTS["residual_diff_threshold"], min=0.001, max=1.0,
                       step=0.01,
                       tooltip="With criterion threshold: a step is served from the cache when the first blocks' "
                               "output changed less than this (relative L1) since the last computed step. Higher: "
                               "faster, less exact. What a threshold costs depends on the model: on the pack's tuning "
                               "bed 0.05 cost a median relative L2 of 0.016 at 20 steps, on a held-out bed it cached "
                               "nothing. Unused by the error criterion."),
        io.Int.Input("first_compute_blocks", default=DEFAULTS["first_compute_blocks"], min=1, max=64, advanced=True,
                     tooltip="Blocks always computed at the start of each forward; their residual decides whether the "
                             "rest is cached."),
        io.Int.Input("last_compute_blocks", default=DEFAULTS["last_compute_blocks"], min=0, max=64, advanced=True,
                     tooltip="Blocks always computed at the end of each forward."),
        io.Int.Input("max_continuous_cached_steps", default=DEFAULTS["max_continuous_cached_steps"], min=-1, max=1000,
                     advanced=True, tooltip="At most this many cached steps in a row before one is computed. "
                                            + NO_LIMIT),
    ]


def calibrator_input():
    """Both Cache-DiT nodes' last input; optional, as the Cache-DiT node's workflows saved before it have none."""
    held = HELD_PER_STREAM
    return io.Combo.Input("calibrator", options=list(CALIBRATORS), default=DEFAULTS["calibrator"], optional=True,
                          advanced=True, tooltip="none: a cached step reuses the last computed residual. The others "
                                                 "forecast it from the computed ones, with cache-dit's calibrator: "
                                                 "taylorseer (first-order TaylorSeer), dmd (an exponential fit to "
                                                 "the last 6 computed steps, Taylor until it has 4), foca (a BDF2 "
                                                 "predictor with a Heun corrector). Memory, in tensors of the "
                                                 f"hidden state per prompt: none {held['none']}, taylorseer "
                                                 f"{held['taylorseer']}, foca {held['foca']}, dmd {held['dmd']} (its "
                                                 "fit in complex128: more still on bf16 experts).")


def criterion_inputs() -> list:
    """Both Cache-DiT nodes' criterion (added after workflows were saved: those keep the threshold)."""
    return [
        io.Combo.Input("criterion", options=list(CRITERIA), default=DEFAULTS["criterion"], optional=True,
                       tooltip="error: each cached step's change to the final latent is estimated from what this "
                               "run measures (at each computed step, what the cache would have missed, through the "
                               "model's own output and CFG, per unit of the first blocks' residual change; the "
                               "sampler's stride at the step), and steps are cached while the cached ones fit "
                               "error_target, on any model, sampler, step count and shift. "
                               "threshold: cache-dit's fixed residual_diff_threshold, whose cost differs from model "
                               "to model (workflows saved before this input keep it)."),
        io.Float.Input("error_target", default=DEFAULTS["error_target"], min=0.0, max=1.0, step=0.0005, round=0.0005,
                       optional=True,
                       tooltip="With criterion error: the change the cache may make to the run's final latent, "
                               "estimated (relative L2 against the uncached run; 0.01 is hard to see, 0.05 a small "
                               "change; 0 caches nothing). The experts share it: their errors add in quadrature, so "
                               "each expert's stage gets 0.71 of it. It is an estimate: to hold a measured budget on "
                               "your model, use the Wan2.2 Cache-DiT Error Budget node."),
    ]


def expert_inputs(role: str) -> list:
    """The two inputs each expert has of its own: its warm-up and its cap on cached steps."""
    word = ROLE_WORDS[role]
    return [
        io.Int.Input(f"{role}_warmup_steps", default=DEFAULTS[f"{role}_warmup_steps"], min=0, max=1000,
                     advanced=True, tooltip=f"Warm-up of the {word} expert: its first steps (transformer evaluations) "
                                            "are always computed in full, before any may be cached. At 4 to 8 "
                                            "steps nothing cached safely on the pack's trained test bed: at 4 no "
                                            "setting cached anything, at 6 and 8 a warm-up of 1 cached 11-29% of "
                                            "the blocks at a relative L2 of 0.05-0.09. Leave the cache off there."),
        io.Int.Input(f"{role}_max_cached_steps", default=DEFAULTS[f"{role}_max_cached_steps"], min=-1, max=1000,
                     advanced=True, tooltip=f"At most this many cached steps on the {word} expert per run (-1 with "
                                            "max_continuous_cached_steps -1 is the most speed at 20-40 steps); 0 never "
                                            "caches it. " + NO_LIMIT),
    ]


class Wan22CacheDiT(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22CacheDiT",
            display_name="Wan2.2 Cache-DiT",
            category=CATEGORY,
            description="Caches transformer blocks on steps where little changes (Cache-DiT DBCache), with a "
                        "context of its own for each expert's stage of each run, built when the stage starts and "
                        "dropped when it ends.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts to cache; the handle this node received stays "
                                                     "uncached for other branches."),
                io.Boolean.Input("enabled", default=True,
                                 tooltip="Off: the experts run without any cache hook (bit-identical to never "
                                         "having enabled it, and to ComfyUI's own KSamplers)."),
                *block_inputs(),
                *expert_inputs("high"),
                *expert_inputs("low"),
                calibrator_input(),
                *criterion_inputs(),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts with this cache plan.")],
            hidden=[io.Hidden.unique_id],
        )

    # Inputs added after workflows were saved, with what those workflows run with (the canvas completes them).
    ADDED_INPUTS = {"calibrator": DEFAULTS["calibrator"], "criterion": SAVED_CRITERION,
                    "error_target": DEFAULTS["error_target"]}

    @classmethod
    def validate_inputs(cls, experts=None):
        return linked_only(experts=experts)

    @classmethod
    def execute(cls, experts, enabled, residual_diff_threshold, first_compute_blocks, last_compute_blocks,
                max_continuous_cached_steps, high_warmup_steps, high_max_cached_steps, low_warmup_steps,
                low_max_cached_steps, calibrator=DEFAULTS["calibrator"], criterion=SAVED_CRITERION,
                error_target=DEFAULTS["error_target"]) -> io.NodeOutput:
        linked_given(experts=experts)
        if not enabled:
            return io.NodeOutput(experts.replace(cache_plan=None, cache_node=None), ui={"text": ["Cache-DiT off"]})
        plan = CachePlan(residual_diff_threshold=float(residual_diff_threshold),
                         first_compute_blocks=first_compute_blocks, last_compute_blocks=last_compute_blocks,
                         max_continuous_cached_steps=max_continuous_cached_steps,
                         high=ExpertCacheSettings(high_warmup_steps, high_max_cached_steps),
                         low=ExpertCacheSettings(low_warmup_steps, low_max_cached_steps), calibrator=calibrator,
                         criterion=criterion, error_target=float(error_target))
        plan.check(experts.architecture.num_layers)
        hidden = getattr(cls, "hidden", None)
        handle = experts.replace(cache_plan=plan, cache_node=hidden.unique_id if hidden is not None else None)
        return io.NodeOutput(handle, ui={"text": [f"{cache_dit_backend.describe_plan(plan)}\n{PASSES_NOTE}"]})


MODEL_NODE = "Wan2.2 Cache-DiT (MODEL)"
MODEL_TURN_OFF = f"set enabled to false on the {MODEL_NODE} node"
MODEL_DEFAULTS = {"warmup_steps": DEFAULTS["high_warmup_steps"], "max_cached_steps": DEFAULTS["high_max_cached_steps"]}


def model_plan(residual_diff_threshold, first_compute_blocks, last_compute_blocks, max_continuous_cached_steps,
               warmup_steps, max_cached_steps, calibrator, criterion=SAVED_CRITERION,
               error_target=DEFAULTS["error_target"]) -> CachePlan:
    """The plan of the MODEL node: one expert's settings (both roles of a CachePlan carry them)."""
    settings = ExpertCacheSettings(warmup_steps, max_cached_steps)
    return CachePlan(residual_diff_threshold=float(residual_diff_threshold), first_compute_blocks=first_compute_blocks,
                     last_compute_blocks=last_compute_blocks, max_continuous_cached_steps=max_continuous_cached_steps,
                     high=settings, low=settings, calibrator=calibrator, criterion=criterion,
                     error_target=float(error_target))


class SampleCallCache(StageCache):
    """The MODEL node's cache: each sample call on the MODEL (each KSampler, KSamplerAdvanced or
    SamplerCustomAdvanced that runs it) is a stage of its own, with a context of its own; after each,
    cache-dit's statistics go to the node's text on the canvas and to the log."""

    def __init__(self, plan: CachePlan, node_id: str | None, layers: int):
        super().__init__(plan, "high", "model", turn_off=MODEL_TURN_OFF, share=MODEL_SHARE)
        self.node_id, self.layers = node_id, layers
        self.last_statistics = None  # the last sample call's (benchmarks read its estimate)

    def sampler_sample(self, executor, *args, **kwargs):
        out = super().sampler_sample(executor, *args, **kwargs)
        self.last_statistics = self.statistics(self.layers)
        line = stats_line(self.last_statistics)
        logging.info("%s %s: %s", MODEL_NODE, self.node_id, line)
        show_on_canvas(self.node_id, line)
        return out


def stats_line(stats: dict) -> str:
    """What one sample call's cache did, in a line."""
    if not stats["cached"]:
        return f"{stats['evaluations']} evaluations; {stats['note']}"
    return (f"{len(stats['cached_steps']) + len(stats['cfg_cached_steps'])} of "
            f"{stats['evaluations']} evaluations cached ({stats['config']}), "
            f"{blocks_saved(stats)}")


def show_on_canvas(node_id: str | None, text: str) -> None:
    """The node's "last run" line on the canvas, sent while the graph runs (the node itself ran before)."""
    if node_id is None:
        return
    try:
        from server import PromptServer
    except ImportError:
        return
    server = getattr(PromptServer, "instance", None)
    if server is not None:  # to the client that queued the prompt (all clients when it gave no id)
        server.send_sync("wan22.cache_used", {"node": node_id, "text": f"last sample call: {text}"},
                         getattr(server, "client_id", None))


def wan_diffusion_model(model):
    """The MODEL's diffusion model, which must be ComfyUI's own Wan transformer, its Fun-Camera one (whose
    camera adapter runs before the block loop, which is WanModel's) or its VACE one (whose hints the cache keeps:
    vace_hints.py): other subclasses (S2V, Animate) add work between the blocks that the cached loop would drop."""
    from comfy.ldm.wan.model import CameraWanModel, VaceWanModel, WanModel

    diffusion_model = model.get_model_object("diffusion_model")
    why = between_blocks(type(diffusion_model).__name__)
    if why is not None:
        raise Wan22InputError("model", f"{MODEL_NODE} cannot cache {type(diffusion_model).__name__}: {why}; "
                                       f"{UNCACHED_HINT}")
    if type(diffusion_model) not in (WanModel, CameraWanModel, VaceWanModel):
        raise Wan22InputError("model", f"{MODEL_NODE} caches ComfyUI's Wan2.2 transformer (WanModel), not "
                                       f"{type(diffusion_model).__name__}: connect a Wan2.2 A14B expert's MODEL")
    return diffusion_model


class Wan22CacheDiTModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22CacheDiTModel",
            display_name=MODEL_NODE,
            category=CATEGORY,
            description="Cache-DiT (DBCache) on one Wan2.2 expert's MODEL, for graphs of ComfyUI's own samplers "
                        "(the official template's two KSamplerAdvanced, a three-stage graph): each sample call on "
                        "this MODEL gets a context of its own, whatever its sampler, installed "
                        "for that call only. Put one on each expert.",
            inputs=[
                io.Model.Input("model", tooltip="One Wan2.2 expert's MODEL (after its LoRAs). The MODEL this node "
                                                "received stays uncached for other branches."),
                io.Boolean.Input("enabled", default=True,
                                 tooltip="Off: the MODEL passes through untouched (bit-identical to the graph "
                                         "without this node)."),
                *block_inputs(),
                io.Int.Input("warmup_steps", default=MODEL_DEFAULTS["warmup_steps"], min=0, max=1000,
                             tooltip="The first evaluations of each sample call, always computed in full. At 4-8 "
                                     "LightX2V steps a stage has 2-4 evaluations, all warm-up at the default, and on "
                                     "the pack's trained test bed nothing cached safely there (warm-up 1: a relative "
                                     "L2 of 0.05-0.09 for 11-29% of the blocks at 6 and 8 steps): leave the cache "
                                     "off (the README's Quality section)."),
                io.Int.Input("max_cached_steps", default=MODEL_DEFAULTS["max_cached_steps"], min=-1, max=1000,
                             tooltip="At most this many cached evaluations per sample call; 0 never caches. At "
                                     "20-40 steps, -1 here and in max_continuous_cached_steps gives the most speed. "
                                     + NO_LIMIT),
                calibrator_input(),
                *criterion_inputs(),
            ],
            outputs=[io.Model.Output(display_name="model", tooltip="The expert with the cache, for a KSampler.")],
            hidden=[io.Hidden.unique_id],
        )

    ADDED_INPUTS = Wan22CacheDiT.ADDED_INPUTS

    @classmethod
    def validate_inputs(cls, model=None):
        return linked_only(model=model)

    @classmethod
    def execute(cls, model, enabled, residual_diff_threshold, first_compute_blocks, last_compute_blocks,
                max_continuous_cached_steps, warmup_steps, max_cached_steps, calibrator=DEFAULTS["calibrator"],
                criterion=SAVED_CRITERION, error_target=DEFAULTS["error_target"]) -> io.NodeOutput:
        linked_given(model=model)
        if not enabled:
            return io.NodeOutput(model, ui={"text": ["Cache-DiT off"]})
        layers = len(wan_diffusion_model(model).blocks)
        plan = model_plan(residual_diff_threshold, first_compute_blocks, last_compute_blocks,
                          max_continuous_cached_steps, warmup_steps, max_cached_steps, calibrator, criterion,
                          error_target)
        plan.check(layers)
        hidden = getattr(cls, "hidden", None)
        cached = model.clone()
        SampleCallCache(plan, hidden.unique_id if hidden is not None else None, layers).attach(cached)
        text = f"{cache_dit_backend.describe(plan, 'high')}; a context of its own for each sample call"
        return io.NodeOutput(cached, ui={"text": [text]})
