"""Checks of the sampler's native CONDITIONING and LATENT against the experts, each refusal a user can act
on (ComfyUI's sampling would otherwise fail deep inside the model, or silently ignore a start image).
Pure: CONDITIONING and LATENT are plain lists, dicts and tensors."""

from __future__ import annotations

from .architecture import ExpertArchitecture
from .errors import Wan22InputError

LATENT_CHANNELS = 16  # the Wan 2.1 VAE's latent, which the A14B experts use
SINGLE_LATENT_CHANNELS = 48  # the Wan2.2 VAE's latent, which TI2V-5B uses


def check_conditioning(conditioning, input_name: str, architecture: ExpertArchitecture) -> None:
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise Wan22InputError(input_name, "is empty: connect a CONDITIONING from a text encoder "
                                          "(e.g. CLIP Text Encode with the umt5 text encoder)")
    for tensor, extras in conditioning:
        if tensor.dim() != 3 or tensor.shape[-1] != architecture.text_dim:
            raise Wan22InputError(input_name, f"has shape {list(tensor.shape)}, but the experts take text "
                                              f"embeddings [batch, tokens, {architecture.text_dim}] from the umt5-xxl "
                                              "text encoder: load Wan's umt5 text encoder (CLIP Loader, type wan)")
        has_image = extras.get("concat_latent_image") is not None
        if architecture.camera and (not has_image or extras.get("camera_conditions") is None):
            raise Wan22InputError(input_name, "the Fun-Camera experts need a start image and a camera path: pass "
                                              "positive and negative through WanCameraImageToVideo, with a "
                                              "start_image and the camera_conditions of WanCameraEmbedding")
        if architecture.task == "i2v" and not has_image:
            raise Wan22InputError(input_name, "the image-to-video experts need a start image: pass positive and "
                                              "negative through WanImageToVideo (WanFunInpaintToVideo for Fun-InP) "
                                              "with a start_image")
        if architecture.task == "fun_control" and not has_image:
            raise Wan22InputError(input_name, "the Fun-Control experts need their control latent: pass positive and "
                                              "negative through Wan22FunControlToVideo")
        if architecture.task == "ti2v" and has_image:
            raise Wan22InputError(input_name, "carries a start image for the A14B image-to-video experts (from "
                                              "WanImageToVideo), but TI2V-5B takes its start image in the latent: use "
                                              "Wan22ImageToVideoLatent with a start_image instead")
        if architecture.task == "t2v" and has_image:
            raise Wan22InputError(input_name, "carries an image-to-video start image (from WanImageToVideo), but "
                                              "the experts are text-to-video: load the Wan2.2 I2V experts, or use "
                                              "Empty Latent Video without WanImageToVideo")


def check_latent(latent, architecture: ExpertArchitecture) -> None:
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if samples is None or not hasattr(samples, "shape"):
        raise Wan22InputError("latent_image", "is not a LATENT: connect Empty Latent Video or WanImageToVideo")
    if samples.dim() != 5:
        raise Wan22InputError("latent_image", f"has shape {list(samples.shape)}; Wan2.2 takes a video latent "
                                              "[batch, 16, frames, height/8, width/8]: use EmptyHunyuanLatentVideo "
                                              "(length 1 for a single image) or WanImageToVideo")
    if architecture.task == "ti2v" and samples.shape[1] != SINGLE_LATENT_CHANNELS:
        raise Wan22InputError("latent_image", f"has {samples.shape[1]} channels; TI2V-5B takes the 48-channel Wan2.2 "
                                              "VAE latent: use Wan22ImageToVideoLatent with the Wan2.2 VAE")
    if architecture.task != "ti2v" and samples.shape[1] != LATENT_CHANNELS:
        raise Wan22InputError("latent_image", f"has {samples.shape[1]} channels; the A14B experts take the "
                                              "16-channel Wan 2.1 VAE latent (48 channels is TI2V-5B's VAE)")


def check_sampler_inputs(architecture: ExpertArchitecture, positive, negative, latent) -> None:
    check_latent(latent, architecture)
    check_conditioning(positive, "positive", architecture)
    check_conditioning(negative, "negative", architecture)
