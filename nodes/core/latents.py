"""Wan latents between ComfyUI's VAE space and the experts' model space, the initial noise, and the
image-to-video input, each done the way ComfyUI does it so that a LATENT means the same here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Wan 2.1 VAE per-channel statistics (ComfyUI's latent_formats.Wan21; scale factor 1.0).
WAN21_LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
LATENT_CHANNELS = 16


def _stats(latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, LATENT_CHANNELS, 1, 1, 1)
    mean = torch.tensor(WAN21_LATENTS_MEAN).view(shape).to(latent.device, latent.dtype)
    std = torch.tensor(WAN21_LATENTS_STD).view(shape).to(latent.device, latent.dtype)
    return mean, std


def to_model_space(latent: torch.Tensor) -> torch.Tensor:
    mean, std = _stats(latent)
    return (latent - mean) / std


def to_vae_space(latent: torch.Tensor) -> torch.Tensor:
    mean, std = _stats(latent)
    return latent * std + mean


def initial_noise(shape, seed: int, batch_index=None) -> torch.Tensor:
    """The same noise as ComfyUI's `comfy.sample.prepare_noise` for this seed (fp32, CPU generator),
    without touching the global RNG. `batch_index` (from a latent batch split) picks noise rows."""
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    if batch_index is None:
        return torch.randn(tuple(shape), dtype=torch.float32, generator=generator, device="cpu")
    wanted = sorted(set(batch_index))
    rows = {}
    for i in range(wanted[-1] + 1):
        row = torch.randn((1, *shape[1:]), dtype=torch.float32, generator=generator, device="cpu")
        if i in wanted:
            rows[i] = row
    return torch.cat([rows[i] for i in batch_index], dim=0)


def _to_size(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Bilinear resize of the last two dims of [B, C, F, H, W] (ComfyUI's common_upscale, crop 'center'
    being a no-op when the aspect ratio already matches, which WanImageToVideo guarantees)."""
    if x.shape[-2:] == (height, width):
        return x
    b, c, f = x.shape[:3]
    flat = x.movedim(2, 1).reshape(b * f, c, *x.shape[-2:])
    flat = F.interpolate(flat, size=(height, width), mode="bilinear", align_corners=False)
    return flat.reshape(b, f, c, height, width).movedim(1, 2)


def _to_batch(x: torch.Tensor, batch: int) -> torch.Tensor:
    if x.shape[0] == batch:
        return x
    reps = -(-batch // x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:batch]


def image_to_video_condition(concat_latent_image: torch.Tensor, concat_mask: torch.Tensor | None,
                             noise_shape) -> torch.Tensor:
    """The 20 extra input channels of an I2V expert: 4 mask channels (1 = known frame) + 16 image
    channels in model space, as ComfyUI's WAN21.concat_cond builds them from WanImageToVideo's output."""
    batch, _, frames, height, width = noise_shape
    image = to_model_space(_to_size(concat_latent_image.float()[:, :LATENT_CHANNELS], height, width))
    image = _to_batch(image, batch)
    if concat_mask is None:
        mask = torch.zeros((batch, 4, frames, height, width))
    else:
        mask = concat_mask.float()
        if mask.shape[1] != 4:
            mask = mask.mean(dim=1, keepdim=True)
        mask = _to_size(1.0 - mask, height, width)
        if mask.shape[2] < frames:
            mask = F.pad(mask, (0, 0, 0, 0, 0, frames - mask.shape[2]), value=0.0)
        if mask.shape[1] == 1:
            mask = mask.repeat(1, 4, 1, 1, 1)
        mask = _to_batch(mask, batch)
    return torch.cat([mask, image], dim=1)
