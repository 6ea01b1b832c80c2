"""Text conditioning from a diffusers Wan2.2 folder's own umt5 text encoder (text_encoder/, tokenizer/),
encoded exactly as diffusers' WanPipeline does: 512 tokens, zeros past the real ones."""

from __future__ import annotations

import os
import re

import torch

from .errors import Wan22InputError

MAX_TOKENS = 512


def load_text_encoder(folder: str, dtype: torch.dtype = torch.float32):
    from transformers import AutoTokenizer, UMT5EncoderModel

    name = os.path.basename(os.path.normpath(folder))
    for sub in ("text_encoder", "tokenizer"):
        if not os.path.isdir(os.path.join(folder, sub)):
            raise Wan22InputError("model_folder", f"{name} has no {sub}/: pick a diffusers Wan2.2 folder that "
                                                  "carries its umt5 text encoder, or use ComfyUI's CLIP Loader "
                                                  "(type wan) with umt5_xxl")
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer"), local_files_only=True)
    model = UMT5EncoderModel.from_pretrained(os.path.join(folder, "text_encoder"), torch_dtype=dtype,
                                             use_safetensors=True, local_files_only=True)
    return tokenizer, model.eval().requires_grad_(False)


def clean_prompt(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def encode(tokenizer, model, prompts: list[str], max_tokens: int = MAX_TOKENS) -> torch.Tensor:
    """[B, max_tokens, d_model] embeddings, zero past each prompt's own tokens."""
    tokens = tokenizer([clean_prompt(p) for p in prompts], padding="max_length", max_length=max_tokens,
                       truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    lengths = tokens.attention_mask.gt(0).sum(dim=1)
    device = next(model.parameters()).device
    with torch.no_grad():
        hidden = model(tokens.input_ids.to(device), tokens.attention_mask.to(device)).last_hidden_state.float().cpu()
    out = torch.zeros_like(hidden)
    for i, n in enumerate(lengths.tolist()):
        out[i, :n] = hidden[i, :n]
    return out
