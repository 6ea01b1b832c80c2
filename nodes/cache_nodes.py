"""Wan2.2 Cache-DiT: puts a cache plan on a new experts handle; the sampler applies it to each expert's
stage of each run, with a context sized to that stage."""

from __future__ import annotations

from comfy_api.latest import io

from .core.cache import CALIBRATORS, CachePlan, ExpertCacheSettings
from .core.experts import ROLE_WORDS
from .types import CATEGORY, ExpertsType

NO_LIMIT = "-1 means no limit."
PASSES_NOTE = "CFG passes (batched or separate) are read from ComfyUI's calls when each stage runs"
DEFAULTS = CachePlan().node_inputs()


def expert_inputs(role: str) -> list:
    """The two inputs each expert has of its own: its warm-up and its cap on cached steps."""
    word = ROLE_WORDS[role]
    return [
        io.Int.Input(f"{role}_warmup_steps", default=DEFAULTS[f"{role}_warmup_steps"], min=0, max=1000,
                     advanced=True, tooltip=f"Warm-up of the {word} expert: its first steps (transformer evaluations) "
                                            "are always computed in full, before any may be cached."),
        io.Int.Input(f"{role}_max_cached_steps", default=DEFAULTS[f"{role}_max_cached_steps"], min=-1, max=1000,
                     advanced=True, tooltip=f"At most this many cached steps on the {word} expert per run; 0 never "
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
                        "context per expert sized by the sampler with that expert's transformer calls in each run.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts to cache; the handle this node received stays "
                                                     "uncached for other branches."),
                io.Boolean.Input("enabled", default=True,
                                 tooltip="Off: the experts run without any cache hook (bit-identical to never "
                                         "having enabled it, and to ComfyUI's own KSamplers)."),
                io.Float.Input("residual_diff_threshold", default=DEFAULTS["residual_diff_threshold"], min=0.001,
                               max=1.0, step=0.01,
                               tooltip="A step is served from the cache when the first blocks' output changed "
                                       "less than this (relative L1) since the last computed step. Higher: "
                                       "faster, less exact. Wan2.2: 0.24."),
                io.Int.Input("first_compute_blocks", default=DEFAULTS["first_compute_blocks"], min=1, max=64,
                             advanced=True, tooltip="Blocks always computed at the start of each forward; their "
                                                    "residual decides whether the rest is cached."),
                io.Int.Input("last_compute_blocks", default=DEFAULTS["last_compute_blocks"], min=0, max=64,
                             advanced=True, tooltip="Blocks always computed at the end of each forward."),
                io.Int.Input("max_continuous_cached_steps", default=DEFAULTS["max_continuous_cached_steps"], min=-1,
                             max=1000, advanced=True,
                             tooltip="At most this many cached steps in a row before one is computed. " + NO_LIMIT),
                *expert_inputs("high"),
                *expert_inputs("low"),
                io.Combo.Input("calibrator", options=list(CALIBRATORS), default=DEFAULTS["calibrator"], optional=True,
                               tooltip="none: a cached step reuses the last computed residual. taylorseer: "
                                       "cache-dit's TaylorSeer forecasts it from the last computed ones "
                                       "(first order)."),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts with this cache plan.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, experts, enabled, residual_diff_threshold, first_compute_blocks, last_compute_blocks,
                max_continuous_cached_steps, high_warmup_steps, high_max_cached_steps, low_warmup_steps,
                low_max_cached_steps, calibrator=DEFAULTS["calibrator"]) -> io.NodeOutput:
        if not enabled:
            return io.NodeOutput(experts.replace(cache_plan=None, cache_node=None), ui={"text": ["Cache-DiT off"]})
        plan = CachePlan(residual_diff_threshold=float(residual_diff_threshold),
                         first_compute_blocks=first_compute_blocks, last_compute_blocks=last_compute_blocks,
                         max_continuous_cached_steps=max_continuous_cached_steps,
                         high=ExpertCacheSettings(high_warmup_steps, high_max_cached_steps),
                         low=ExpertCacheSettings(low_warmup_steps, low_max_cached_steps), calibrator=calibrator)
        plan.check(experts.architecture.num_layers)
        hidden = getattr(cls, "hidden", None)
        handle = experts.replace(cache_plan=plan, cache_node=hidden.unique_id if hidden is not None else None)
        return io.NodeOutput(handle, ui={"text": [f"{plan.summary()}\n{PASSES_NOTE}"]})
