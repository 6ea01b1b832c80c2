"""The experts handle the core tests build around tiny diffusers experts (the loaders are tested apart)."""

import torch

from wan22_cachedit.nodes.core.experts import Wan22Experts, WanExpertConfig


def handle(high, low, *, plan=None, loras=(), dtype=torch.float32, default=0.875):
    model = high if high is not None else low
    return Wan22Experts(high_noise=high, low_noise=low, config=WanExpertConfig.from_diffusers_config(model.config),
                        dtype=dtype, sources=("h" if high else "none", "l" if low else "none"),
                        default_boundary=default, cache_plan=plan, loras=tuple(loras))
