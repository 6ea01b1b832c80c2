"""Wan2.2 Cache-DiT: attaches a cache plan to the experts handle (a new handle; the sampler applies it)."""

from __future__ import annotations

from comfy_api.latest import io

from .core.cache import CachePlan, ExpertCacheSettings
from .types import CATEGORY, ExpertsType

NO_LIMIT = "-1 means no limit."


class Wan22CacheDiT(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22CacheDiT",
            display_name="Wan2.2 Cache-DiT",
            category=CATEGORY,
            description="Caches transformer blocks on steps where little changes (Cache-DiT DBCache), with a "
                        "context per expert sized by the sampler with that expert's steps in each run.",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts to cache; the loader's own handle stays "
                                                     "uncached for other branches."),
                io.Boolean.Input("enabled", default=True,
                                 tooltip="Off: the experts run without any cache hook (bit-identical to never "
                                         "having enabled it)."),
                io.Float.Input("residual_diff_threshold", default=0.24, min=0.001, max=1.0, step=0.01,
                               tooltip="A step is served from the cache when the first blocks' output changed "
                                       "less than this (relative L1) since the last computed step. Higher: "
                                       "faster, less exact. Wan2.2: 0.24."),
                io.Int.Input("first_compute_blocks", default=1, min=1, max=64,
                             tooltip="Blocks always computed at the start of each forward; their residual "
                                     "decides whether the rest is cached."),
                io.Int.Input("last_compute_blocks", default=0, min=0, max=64,
                             tooltip="Blocks always computed at the end of each forward."),
                io.Int.Input("max_continuous_cached_steps", default=3, min=-1, max=1000,
                             tooltip="At most this many cached steps in a row before one is computed. " + NO_LIMIT),
                io.Int.Input("high_warmup_steps", default=4, min=0, max=1000,
                             tooltip="Warm-up of the high-noise expert: its first steps are always computed in "
                                     "full, before any may be cached."),
                io.Int.Input("high_max_cached_steps", default=-1, min=-1, max=1000,
                             tooltip="At most this many cached steps on the high-noise expert per run; 0 never "
                                     "caches it. " + NO_LIMIT),
                io.Int.Input("low_warmup_steps", default=2, min=0, max=1000,
                             tooltip="Warm-up of the low-noise expert: its first steps are always computed in "
                                     "full."),
                io.Int.Input("low_max_cached_steps", default=20, min=-1, max=1000,
                             tooltip="At most this many cached steps on the low-noise expert per run; 0 never "
                                     "caches it. " + NO_LIMIT),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The experts with this cache plan.")],
        )

    @classmethod
    def execute(cls, experts, enabled, residual_diff_threshold, first_compute_blocks, last_compute_blocks,
                max_continuous_cached_steps, high_warmup_steps, high_max_cached_steps, low_warmup_steps,
                low_max_cached_steps) -> io.NodeOutput:
        if not enabled:
            return io.NodeOutput(experts.replace(cache_plan=None), ui={"text": ["Cache-DiT off"]})
        plan = CachePlan(residual_diff_threshold=float(residual_diff_threshold),
                         first_compute_blocks=first_compute_blocks, last_compute_blocks=last_compute_blocks,
                         max_continuous_cached_steps=max_continuous_cached_steps,
                         high=ExpertCacheSettings(high_warmup_steps, high_max_cached_steps),
                         low=ExpertCacheSettings(low_warmup_steps, low_max_cached_steps))
        plan.check(experts.config.num_layers)
        return io.NodeOutput(experts.replace(cache_plan=plan), ui={"text": [plan.summary()]})
