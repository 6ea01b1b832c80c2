"""The cache's memory through ComfyUI's own memory management, for one cached stage.

Before a sampling, ComfyUI's prepare_sampling asks the model what this latent needs (its memory_required, for
the prompts batched and for one), and load_models_gpu frees or offloads other models, and sizes a partial load of
this one, to leave that much free. The tensors a cache holds between steps are not in that estimate; they are
known before the stage samples (core.cache.cache_bytes: the hidden state's size, the prompts the sampling runs,
the calibrator). So, for the stage's prepare_sampling call only, the model's estimate is that plus the cache's
bytes, and ComfyUI makes room for them as for any model's needs: no flag held back from every other workflow.

The estimate is the shared model's method, so it is raised on that object for the length of the one call and
put back in `finally`; the sampling itself, whose prompt batching also reads the estimate, sees it as it was.
The prompts the sampling runs are the guider's (OUTER_SAMPLE, which calls prepare_sampling): the negative
prompt is not run at CFG 1, as ComfyUI's sampling skips it. A worker of a parallel plan holds its share of the
tensors (its prompts, its shard of the sequence), which its split puts in the stage's transformer_options
(SHARE).
"""

from __future__ import annotations

import math

import comfy.patcher_extension

from .core import cache as core
from .core.parallel import latent_tokens
from .wrapper_calls import call_argument

KEY = "wan22_cache_memory"
SHARE = "wan22_cache_memory_share"  # transformer_options: {"prompts": degree, "sequence": degree} of a worker
WrappersMP = comfy.patcher_extension.WrappersMP


def streams_run(conds: dict, cfg: float, model_options: dict) -> int:
    """The prompt streams a sampling runs: the guider's prompts, less the negative one at CFG 1."""
    present = [name for name, entries in (conds or {}).items() if entries]
    skips_negative = math.isclose(float(cfg), 1.0) and not model_options.get("disable_cfg1_optimization", False)
    return max(1, len([name for name in present if not (skips_negative and name == "negative")]))


class CacheMemory:
    """Attached to the stage's own clone beside its cache: `asked` is the bytes ComfyUI was told of at the last
    prepare_sampling (None before; 0 where the stage does not cache)."""

    def __init__(self, plan: core.CachePlan, role: str):
        self.plan, self.role = plan, role
        self.cfg = 1.0
        self.asked = None

    def attach(self, model) -> None:
        model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY, self.outer_sample)
        model.add_wrapper_with_key(WrappersMP.PREPARE_SAMPLING, KEY, self.prepare_sampling)

    def outer_sample(self, executor, *args, **kwargs):
        self.cfg = float(getattr(executor.class_obj, "cfg", 1.0))
        return executor(*args, **kwargs)

    def bytes_for(self, model, noise_shape, conds, model_options: dict) -> int:
        if not self.plan.caches(self.role):
            return 0
        diffusion_model = model.model.diffusion_model
        share = model_options.get("transformer_options", {}).get(SHARE, {})
        return core.cache_bytes(tokens=latent_tokens(noise_shape, tuple(diffusion_model.patch_size)),
                                width=int(diffusion_model.dim),
                                itemsize=model.model.get_dtype_inference().itemsize,
                                streams=streams_run(conds, self.cfg, model_options), batch=int(noise_shape[0]),
                                calibrator=self.plan.calibrator, vace=hasattr(diffusion_model, "vace_layers_mapping"),
                                prompt_degree=int(share.get("prompts", 1)),
                                sequence_degree=int(share.get("sequence", 1)))

    def prepare_sampling(self, executor, *args, **kwargs):
        model = call_argument(executor, args, kwargs, "model")
        model_options = call_argument(executor, args, kwargs, "model_options") or {}
        self.asked = self.bytes_for(model, call_argument(executor, args, kwargs, "noise_shape"),
                                    call_argument(executor, args, kwargs, "conds"), model_options)
        if not self.asked:
            return executor(*args, **kwargs)
        base, extra = model.model, self.asked
        own = base.__dict__.get("memory_required")  # an instance's own, where something set one (else the class's)
        estimate = base.memory_required

        def with_cache(*a, **k):
            return estimate(*a, **k) + extra
        base.memory_required = with_cache
        try:
            return executor(*args, **kwargs)
        finally:
            if own is None:
                del base.memory_required
            else:
                base.memory_required = own
