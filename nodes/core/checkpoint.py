"""Reading ComfyUI-style single-file Wan checkpoints: header checks, key prefixes, fp8 dequantisation.

Only safetensors are read (never a pickle). The header is checked against the file size before any
tensor is touched, so a truncated download is reported as such instead of failing deep in a loader.
"""

from __future__ import annotations

import json
import os
import struct

import torch

# Where ComfyUI's repackaged files (and others) keep the diffusion model's tensors.
KEY_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
MAX_HEADER_BYTES = 100 * 1024 * 1024

FP8_FORMATS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


class CheckpointFileError(ValueError):
    """The file cannot be read as a safetensors checkpoint (missing, truncated, corrupt)."""


def read_header(path: str) -> tuple[dict, dict]:
    """(tensor entries, metadata) of a safetensors file, after checking it is whole."""
    if not os.path.isfile(path):
        raise CheckpointFileError(f"file not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointFileError(f"{os.path.basename(path)} is not a safetensors file ({size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointFileError(f"{os.path.basename(path)} is not a safetensors file or is truncated "
                                      f"(its header claims {header_len} bytes, the file has {size})")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointFileError(f"{os.path.basename(path)} has a corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointFileError(f"{os.path.basename(path)} has a corrupt safetensors header")
    metadata = header.pop("__metadata__", None) or {}
    end = 0
    for name, entry in header.items():
        try:
            begin, stop = entry["data_offsets"]
            entry["shape"] = [int(d) for d in entry["shape"]]
        except (KeyError, TypeError, ValueError):
            raise CheckpointFileError(f"{os.path.basename(path)} has a corrupt entry for tensor {name!r}") from None
        end = max(end, int(stop))
    data_bytes = size - 8 - header_len
    if end != data_bytes:
        what = "truncated" if end > data_bytes else "corrupt"
        raise CheckpointFileError(f"{os.path.basename(path)} is {what}: its header describes {end} bytes of "
                                  f"tensors but the file holds {data_bytes}")
    return header, metadata


def key_prefix(names) -> str:
    """The prefix under which the diffusion model's tensors sit ('' for a bare transformer file)."""
    for prefix in KEY_PREFIXES:
        if any(n.startswith(prefix) for n in names):
            return prefix
    return ""


def strip_prefix(names, prefix: str) -> list[str]:
    return [n[len(prefix):] for n in names if n.startswith(prefix)]


def _quant_layers(read, names: set[str], metadata: dict) -> dict[str, str]:
    """layer name -> fp8 format, for both of ComfyUI's scaled fp8 formats."""
    layers: dict[str, str] = {}
    if "_quantization_metadata" in metadata:  # newer format, layer table in the file's metadata
        for layer, conf in json.loads(metadata["_quantization_metadata"]).get("layers", {}).items():
            layers[layer] = conf.get("format")
    for name in names:
        if name.endswith(".comfy_quant"):  # newer format, one JSON blob per layer
            conf = json.loads(read(name).numpy().tobytes())
            layers[name[: -len(".comfy_quant")]] = conf.get("format")
        elif name.endswith(".scale_weight") and "scaled_fp8" in names:  # older format: marker + scale_weight
            layers[name[: -len(".scale_weight")]] = "float8_e4m3fn"
    return layers


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
                      "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def _read_tensor(f, data_start: int, name: str, entry: dict, path: str) -> torch.Tensor:
    """Reads one tensor straight into memory of its own (aligned, owned), without mapping the file:
    a mapped file would count twice in the process's memory while its tensors are copied out."""
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise CheckpointFileError(f"{os.path.basename(path)}: tensor {name} has the unsupported dtype {entry['dtype']}")
    tensor = torch.empty(entry["shape"], dtype=dtype)
    begin, end = entry["data_offsets"]
    if end - begin != tensor.numel() * tensor.element_size():
        raise CheckpointFileError(f"{os.path.basename(path)} is corrupt: tensor {name} does not fit its shape")
    if end > begin:
        f.seek(data_start + begin)
        if f.readinto(memoryview(tensor.reshape(-1).view(torch.uint8).numpy())) != end - begin:
            raise CheckpointFileError(f"{os.path.basename(path)} is truncated at tensor {name}")
    return tensor


def load_state_dict(path: str, dtype: torch.dtype, fp8_out: dict | None = None) -> dict[str, torch.Tensor]:
    """The diffusion model's tensors in the original Wan layout (prefix stripped), in `dtype`.

    fp8 weights are dequantised with their per-layer scales (`weight.to(dtype) * scale`), or, when
    `fp8_out` is given, left in fp8: `fp8_out[weight name] = (fp8 weight, scale)` and the state dict holds
    a zero-cost stand-in of the weight's shape in their place. The scale and marker tensors are consumed and do
    not appear in the result.
    """
    header, metadata = read_header(path)
    prefix = key_prefix(header)
    names = set(strip_prefix(header, prefix))
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        data_start = 8 + header_len

        def read(name: str) -> torch.Tensor:
            return _read_tensor(f, data_start, name, header[prefix + name], path)

        layers = _quant_layers(read, names, metadata)
        for layer, fmt in layers.items():
            if fmt not in FP8_FORMATS:
                raise CheckpointFileError(f"{os.path.basename(path)}: layer {layer} uses the quantisation "
                                          f"format {fmt!r}, which this loader cannot dequantise; use an "
                                          "fp16, bf16 or fp8 (scaled) file")
        consumed = {"scaled_fp8"}
        for layer in layers:
            consumed |= {f"{layer}.{s}" for s in ("comfy_quant", "scale_weight", "scale_input",
                                                  "weight_scale", "input_scale")}
        state_dict: dict[str, torch.Tensor] = {}
        for name in sorted(names - consumed):
            tensor = read(name)
            layer = name[: -len(".weight")] if name.endswith(".weight") else None
            if layer in layers:
                scale_name = f"{layer}.weight_scale" if f"{layer}.weight_scale" in names else f"{layer}.scale_weight"
                if tensor.dtype == torch.uint8:  # fp8 stored as raw bytes
                    tensor = tensor.view(FP8_FORMATS[layers[layer]])
                scale = read(scale_name).to(torch.float32) if scale_name in names else torch.tensor(1.0)
                if fp8_out is not None:
                    fp8_out[name] = (tensor, scale)
                    # A stand-in of the right shape over one element of storage: it costs no memory, and the
                    # layer is replaced by its fp8 one once the model is built.
                    state_dict[name] = torch.zeros(1, dtype=dtype).expand(tensor.shape)
                    continue
                tensor = tensor.to(dtype).mul_(scale)
            state_dict[name] = tensor.to(dtype)
    return state_dict


def stored_float_dtype(header: dict) -> torch.dtype | None:
    """The dtype most of the file's weights are stored in (fp8 counted as such)."""
    counts: dict[str, int] = {}
    for entry in header.values():
        n = 1
        for d in entry["shape"]:
            n *= d
        counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + n
    if not counts:
        return None
    top = max(counts, key=counts.get)
    return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}.get(top)
