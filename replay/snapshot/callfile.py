"""Call files and segments: safetensors files whose header metadata holds calls' descriptions.

A call file (formats 1-3) holds one call: tensor keys are '<role>/<name>' (role: in, out,
state, tag), each stored tensor the storage span of the recorded view, and the metadata entry
'replay.call' is JSON with op, variant, provider, args, launch and, per tensor key, its
geometry; a tensor stored as a blob has no data here, only its geometry and the blob's hash.
A segment (format 4) holds many: each call's keys and metadata entry carry its prefix
('c000017/in/x', 'c000017/replay.call'); a call file is a segment of one call, prefix ''.
"""
from __future__ import annotations

import functools
import json
import struct
from typing import Any, Sequence

import safetensors.torch
import torch

from replay.snapshot import schema

META_KEY = "replay.call"
BLOB_KEY = "data"
ROLES = ("in", "out", "state", "tag")  # of a call's tensors
# of the keys stored with a call: a mask (kept/) and an edit list (edits/) are read into the tensor they describe
KEY_ROLES = ROLES + ("kept", "edits")


# safetensors' dtype names, in the order its writer ranks them: tensors are laid out by rank,
# highest first, then by name, so that each starts aligned to its element size
_DTYPE_NAMES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.float8_e5m2: "F8_E5M2",
                torch.float8_e4m3fn: "F8_E4M3", torch.int16: "I16", torch.uint16: "U16", torch.float16: "F16",
                torch.bfloat16: "BF16", torch.int32: "I32", torch.uint32: "U32", torch.float32: "F32",
                torch.complex64: "C64", torch.float64: "F64", torch.int64: "I64", torch.uint64: "U64"}
_RANK = {dtype: rank for rank, dtype in enumerate(_DTYPE_NAMES)}

Buffer = Any  # bytes, or a memoryview/numpy array over a tensor's memory


def call_prefix(index: int) -> str:
    """What a call's tensor keys and metadata entry start with in a segment."""
    return f"c{index:06d}/"


def serialize_parts(metadata: dict[str, str] | None, spans: dict[str, torch.Tensor]) -> Sequence[Buffer]:
    """A segment or call file (or, with no metadata, a blob file) as the buffers to write one
    after another: its safetensors header, then each tensor's bytes where they lie, uncopied. The
    bytes are those safetensors.torch.save writes, for every dtype a snapshot holds (tensors.DTYPES)."""
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata is not None else {}
    parts: list[Buffer] = [b""]
    offset = 0
    for name in sorted(spans, key=lambda key: (-_RANK[spans[key].dtype], key)):
        span = spans[name]
        nbytes = span.numel() * span.element_size()
        entries[name] = {"dtype": _DTYPE_NAMES[span.dtype], "shape": list(span.shape),
                         "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        if nbytes:
            flat = span if span.dim() == 1 and span.stride(0) == 1 and not span.requires_grad else \
                span.detach().contiguous().as_strided((span.numel(),), (1,))  # a lone element may have any stride
            parts.append(flat.view(torch.uint8).numpy())
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    parts[0] = struct.pack("<Q", len(text)) + text
    return parts


def serialize_blob(span: torch.Tensor) -> Sequence[Buffer]:
    """A blob file: one tensor under 'data', no metadata (its name is its sha256)."""
    return serialize_parts(None, {BLOB_KEY: span})


@functools.lru_cache(maxsize=8)
def blob_prefix(nbytes: int) -> bytes:
    """What comes before the data in the blob file of `nbytes` uint8 values: a chunk's file is
    this prefix and the chunk's bytes."""
    return bytes(serialize_blob(torch.zeros(nbytes, dtype=torch.uint8))[0])


def read_metadata(data: bytes) -> dict[str, Any]:
    """A call file's or segment's safetensors metadata (raises ValueError if malformed)."""
    if len(data) < 8:
        raise ValueError("file is shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("header runs past the end of the file (truncated?)")
    header = schema.parse(data[8:8 + size], "document")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict):
        raise ValueError(f"no '{META_KEY}' metadata: not a replay call file")
    return meta


def call_text(metadata: dict[str, Any], prefix: str) -> str:
    """The JSON description of the call `prefix` names in a file's metadata (ValueError if none)."""
    text = metadata.get(prefix + META_KEY)
    if not isinstance(text, str):
        raise ValueError(f"no '{prefix}{META_KEY}' metadata: " + (f"the segment holds no call {prefix[:-1]}"
                                                                    if prefix else "not a replay call file"))
    return text


def read_spans(data: bytes) -> dict[str, torch.Tensor]:
    return safetensors.torch.load(data)
