"""From ComfyUI's native CONDITIONING and LATENT to the loop's tensors, with every refusal a user
can act on. Pure: the CONDITIONING/LATENT structures are plain lists, dicts and tensors."""

from __future__ import annotations

import torch

from .denoise import DenoiseInputs
from .errors import Wan22InputError
from .experts import Wan22Experts
from .latents import LATENT_CHANNELS, image_to_video_condition, initial_noise


def _single_entry(conditioning, input_name: str):
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise Wan22InputError(input_name, "is empty: connect a CONDITIONING from a text encoder "
                                          "(e.g. CLIP Text Encode with the umt5 text encoder)")
    if len(conditioning) > 1:
        raise Wan22InputError(input_name, f"has {len(conditioning)} entries (from Conditioning Combine or "
                                          "Concat?): this sampler takes one text conditioning; encode one prompt")
    tensor, extras = conditioning[0]
    return tensor, extras


def _text(tensor: torch.Tensor, input_name: str, experts: Wan22Experts, batch: int) -> torch.Tensor:
    if tensor.dim() != 3 or tensor.shape[-1] != experts.config.text_dim:
        raise Wan22InputError(input_name, f"has shape {list(tensor.shape)}, but the experts take text embeddings "
                                          f"[batch, tokens, {experts.config.text_dim}] from the umt5-xxl text "
                                          "encoder: load Wan's umt5 text encoder")
    if tensor.shape[0] not in (1, batch):
        raise Wan22InputError(input_name, f"has batch {tensor.shape[0]} but the latent has batch {batch}: "
                                          "use one prompt, or one per latent")
    return tensor.expand(batch, -1, -1) if tensor.shape[0] != batch else tensor


def check_latent(latent: dict, experts: Wan22Experts) -> torch.Tensor:
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor):
        raise Wan22InputError("latent_image", "is not a LATENT: connect Empty Latent Video or WanImageToVideo")
    if samples.dim() != 5:
        raise Wan22InputError("latent_image", f"has shape {list(samples.shape)}; Wan2.2 takes a video latent "
                                              "[batch, 16, frames, height/8, width/8]: use EmptyHunyuanLatentVideo "
                                              "(length 1 for a single image) or WanImageToVideo")
    if samples.shape[1] != LATENT_CHANNELS:
        raise Wan22InputError("latent_image", f"has {samples.shape[1]} channels; the A14B experts take the "
                                              "16-channel Wan 2.1 VAE latent (48 channels is the 5B model's VAE)")
    patch = experts.config.patch_size
    if samples.shape[-2] % patch[1] or samples.shape[-1] % patch[2]:
        raise Wan22InputError("latent_image", f"is {samples.shape[-1] * 8}x{samples.shape[-2] * 8} pixels; width "
                                              "and height must be multiples of 16")
    return samples


def prepare_inputs(experts: Wan22Experts, positive, negative, latent: dict, seed: int) -> DenoiseInputs:
    """The loop's inputs for one run. The run starts from pure noise, as a KSampler at denoise 1.0
    does for flow models (and as diffusers' WanPipeline does): the latent gives shape and batch."""
    samples = check_latent(latent, experts)
    batch = samples.shape[0]
    pos_tensor, pos_extras = _single_entry(positive, "positive")
    neg_tensor, _ = _single_entry(negative, "negative")
    noise = initial_noise(samples.shape, seed, latent.get("batch_index"))

    has_image = pos_extras.get("concat_latent_image") is not None
    condition = None
    if experts.task == "i2v":
        if not has_image:
            raise Wan22InputError("positive", "the image-to-video experts need a start image: pass positive and "
                                              "negative through WanImageToVideo with a start_image")
        condition = image_to_video_condition(pos_extras["concat_latent_image"], pos_extras.get("concat_mask"),
                                             samples.shape)
    elif has_image:
        raise Wan22InputError("positive", "carries an image-to-video start image (from WanImageToVideo), but the "
                                          "experts are text-to-video: load the Wan2.2 I2V experts, or use Empty "
                                          "Latent Video without WanImageToVideo")
    return DenoiseInputs(positive=_text(pos_tensor, "positive", experts, batch),
                         negative=_text(neg_tensor, "negative", experts, batch), noise=noise, condition=condition)
