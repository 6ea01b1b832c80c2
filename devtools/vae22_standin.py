"""A working stand-in for the Wan2.2 VAE file (`wan2.2_vae.safetensors`), the 48-channel VAE of TI2V-5B.

ComfyUI 0.30 recognises the Wan2.2 VAE by two keys and then builds it from a fixed config (width 160,
705 M parameters) whatever the file holds, so, as for umt5-xxl, the only stand-in that runs honestly is a
full-size one: every tensor of ComfyUI's own `comfy.ldm.wan.vae2_2.WanVAE`, under its names (those of
the original Wan2.2 file), fp16, with deterministic random values (norm scales 1, biases 0, weights
N(0, 1 / fan-in)). About 1.4 GB on disk, ten seconds to write. Encoding a 64 x 64 start image with it
takes a few seconds on two cores. Needs ComfyUI importable (the caller puts it on sys.path).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

CONFIG = {"dim": 160, "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
          "temperal_downsample": [False, True, True], "dropout": 0.0}


def write_wan22_vae_standin(path: str, seed: int = 22) -> str:
    from comfy.ldm.wan.vae2_2 import WanVAE

    with torch.device("meta"):  # the names and shapes only: the values are drawn below, tensor by tensor
        shapes = {name: tuple(t.shape) for name, t in WanVAE(**CONFIG).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("gamma"):
            value = torch.ones(shape)
        elif name.endswith("bias"):
            value = torch.zeros(shape)
        else:
            fan_in = max(1, torch.Size(shape[1:]).numel())
            value = torch.randn(shape, generator=generator).mul_(fan_in ** -0.5)
        tensors[name] = value.to(torch.float16)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    save_file(tensors, partial, metadata={"format": "pt"})
    os.replace(partial, path)  # never a half-written file under the real name
    return path
