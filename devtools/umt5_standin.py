"""A working stand-in for ComfyUI's umt5-xxl text encoder file (`umt5_xxl_fp8_e4m3fn_scaled.safetensors`).

ComfyUI 0.30 builds umt5-xxl from a fixed config (comfy/text_encoders/umt5_config_xxl.json: 24 layers,
width 4096, feed-forward 10240, vocabulary 256384) whatever the file holds, and leaves any parameter
the file lacks uninitialised; so the only stand-in that runs honestly is a full-size one. This writes
it in Comfy-Org's scaled-fp8 layout (a `scaled_fp8` marker, fp8 e4m3fn linear weights with a
`scale_weight` each, bf16 embedding and norms) with deterministic random values, streaming one tensor
at a time (about 6.7 GB on disk, about 1 GB of memory while writing, half a minute). The tokenizer is
a small sentencepiece model trained here, stored under `spiece_model` as in the real file.

Encoding with it takes about a minute per prompt on two cores (512 padded tokens, fp8 weights
dequantised per layer) and about 10 GB of memory in the ComfyUI process.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct

import torch

DIM, FFN, LAYERS, VOCAB, HEADS, BUCKETS = 4096, 10240, 24, 256384, 64, 32
LINEARS = (("layer.0.SelfAttention.q", (DIM, DIM)), ("layer.0.SelfAttention.k", (DIM, DIM)),
           ("layer.0.SelfAttention.v", (DIM, DIM)), ("layer.0.SelfAttention.o", (DIM, DIM)),
           ("layer.1.DenseReluDense.wi_0", (FFN, DIM)), ("layer.1.DenseReluDense.wi_1", (FFN, DIM)),
           ("layer.1.DenseReluDense.wo", (DIM, FFN)))
SAFETENSORS_DTYPES = {torch.float8_e4m3fn: "F8_E4M3", torch.uint8: "U8", torch.bfloat16: "BF16",
                      torch.float32: "F32"}
CORPUS = ("a red fox trots through fresh snow in a birch forest at sunrise the camera tracking beside it "
          "a lighthouse on a rocky cliff under a stormy sky waves breaking below dramatic light photograph "
          "the scene comes alive light shifts slowly across the frame as the camera pushes in "
          "beautiful young woman with honey blonde hair turning her head gentle smile bright eyes cinematic "
          "blurry low quality static overexposed subtitles text watermark deformed extra fingers messy "
          "background a cat walks in the rain city street night video of")


def sentencepiece_model() -> bytes:
    """A small unigram tokenizer with umt5's special ids (pad 0, eos 1, unk 2)."""
    import sentencepiece

    words = CORPUS.split()
    sentences = [" ".join(words[i:i + 12]) for i in range(0, len(words), 3)] * 4
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=128, model_type="unigram", pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
        normalization_rule_name="identity", num_threads=1)
    return buffer.getvalue()


def _entries(spiece: bytes):
    """(name, shape, dtype, producer) in file order; producers return a tensor or yield chunks of one."""
    base: dict[tuple, torch.Tensor] = {}

    def unit_normal(shape, seed):  # one N(0, 1) block per shape, shifted per layer: cheap and deterministic
        if shape not in base:
            base[shape] = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).clamp_(-4, 4)
        return base[shape]

    def embedding():
        for row in range(0, VOCAB, 8192):
            g = torch.Generator().manual_seed(1000 + row)
            yield torch.randn((min(8192, VOCAB - row), DIM), generator=g).to(torch.bfloat16)

    yield "scaled_fp8", (0,), torch.float8_e4m3fn, lambda: torch.empty(0, dtype=torch.float8_e4m3fn)
    yield "spiece_model", (len(spiece),), torch.uint8, lambda: torch.frombuffer(bytearray(spiece), dtype=torch.uint8)
    yield "shared.weight", (VOCAB, DIM), torch.bfloat16, embedding
    for i in range(LAYERS):
        prefix = f"encoder.block.{i}."
        for n, (name, shape) in enumerate(LINEARS):
            scale = 0.5 / math.sqrt(shape[1])  # the weight's effective spread once scaled
            yield (prefix + name + ".weight", shape, torch.float8_e4m3fn,
                   lambda shape=shape, i=i, n=n: torch.roll(unit_normal(shape, 7 + n), shifts=i * 7919, dims=1)
                   .to(torch.float8_e4m3fn))
            yield prefix + name + ".scale_weight", (), torch.float32, lambda scale=scale: torch.tensor(scale)
        yield (prefix + "layer.0.SelfAttention.relative_attention_bias.weight", (BUCKETS, HEADS), torch.bfloat16,
               lambda i=i: (torch.linspace(-1, 1, BUCKETS * HEADS).reshape(BUCKETS, HEADS) * 0.1 * (1 + i % 3))
               .to(torch.bfloat16))
        for norm in ("layer.0.layer_norm.weight", "layer.1.layer_norm.weight"):
            yield prefix + norm, (DIM,), torch.bfloat16, lambda: torch.ones(DIM, dtype=torch.bfloat16)
    yield "encoder.final_layer_norm.weight", (DIM,), torch.bfloat16, lambda: torch.ones(DIM, dtype=torch.bfloat16)


def write_umt5_standin(path: str) -> str:
    """Writes the safetensors file tensor by tensor (the header first, from the shapes)."""
    entries = list(_entries(sentencepiece_model()))
    header, offset = {}, 0
    for name, shape, dtype, _ in entries:
        size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, _, dtype, produce in entries:
            produced = produce()
            for chunk in ([produced] if torch.is_tensor(produced) else produced):
                assert chunk.dtype == dtype, name
                if chunk.numel():
                    f.write(memoryview(chunk.contiguous().view(-1).view(torch.uint8).numpy()))
    os.replace(partial, path)  # never a half-written file under the real name
    return path
