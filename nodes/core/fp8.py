"""fp8 weights kept in fp8: a Linear that dequantises its weight with its scale on each call, as
ComfyUI's own scaled-fp8 layers do. Half the memory of a dequantised copy, and the same numbers:
the weight used is `weight.to(dtype) * scale`, computed exactly as a load-time dequantisation would."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Fp8ScaledLinear(torch.nn.Linear):
    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.nn.Parameter | None,
                 compute_dtype: torch.dtype):
        torch.nn.Module.__init__(self)  # no fresh weight is allocated
        self.out_features, self.in_features = weight.shape
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        self.register_buffer("scale", scale.to(torch.float32).reshape(()))
        self.compute_dtype = compute_dtype

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight.to(self.compute_dtype).mul_(self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight().to(x.dtype), bias)


def install_fp8_layers(model: torch.nn.Module, layers: dict[str, tuple[torch.Tensor, torch.Tensor]],
                       compute_dtype: torch.dtype) -> None:
    """Replaces each named Linear (diffusers names) with an fp8 one holding the file's weight and scale."""
    for name, (weight, scale) in layers.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        setattr(parent, child, Fp8ScaledLinear(weight, scale, old.bias, compute_dtype))
