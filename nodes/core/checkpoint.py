"""Checking safetensors files before ComfyUI loads them: the header against the file size, and the
architecture of a single-file Wan expert from its header alone.

Only safetensors are accepted (never a pickle). A truncated download is reported as such at queue time
instead of failing deep in a loader.
"""

from __future__ import annotations

import json
import os
import struct

from .architecture import ExpertArchitecture, architecture_from_shapes
from .errors import Wan22InputError

# Where ComfyUI's repackaged files (and others) keep the diffusion model's tensors.
KEY_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
MAX_HEADER_BYTES = 100 * 1024 * 1024

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


def check_file(path: str, input_name: str, what: str = "file") -> dict:
    """The header of a whole safetensors file, or an error naming the input and the fix."""
    try:
        header, _ = read_header(path)
    except CheckpointFileError as e:
        raise Wan22InputError(input_name, f"{e}; download the {what} again or pick another one") from None
    return header


GGUF_SHAPE_KEY = "comfy.gguf.orig_shape."  # where ComfyUI-GGUF files keep the shapes GGUF cannot hold (5-D)


def gguf_shapes(path: str, input_name: str) -> dict[str, list[int]]:
    """The torch shapes of a GGUF file's tensors, from its header (memory-mapped, nothing dequantized), as
    ComfyUI-GGUF's loader reads them: GGUF lists dimensions innermost first, and a shape the format cannot
    hold is kept in the file's metadata. Reading needs the `gguf` package, which ComfyUI-GGUF requires."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, KeyError, IndexError) as e:
        raise Wan22InputError(input_name, f"{os.path.basename(path)} is not a readable GGUF file ({e}); download "
                                          "it again or pick another one") from None
    kept = {name[len(GGUF_SHAPE_KEY):]: [int(field.parts[i][0]) for i in field.data]
            for name, field in reader.fields.items() if name.startswith(GGUF_SHAPE_KEY)}
    return {t.name: kept.get(t.name) or [int(d) for d in reversed(t.shape.tolist())] for t in reader.tensors}


def expert_architecture(path: str, input_name: str) -> ExpertArchitecture:
    """Header-only check of one single-file expert, safetensors or GGUF (cheap enough for prompt validation)."""
    if path.endswith(".gguf"):
        shapes = gguf_shapes(path, input_name)
    else:
        shapes = {k: v["shape"] for k, v in check_file(path, input_name).items()}
    prefix = key_prefix(shapes)
    shapes = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    return architecture_from_shapes(shapes, input_name, os.path.basename(path))
