"""One call file: a safetensors file whose header metadata holds the call's description.

Tensor keys are '<role>/<name>' (role: in, out, state, tag); each stored tensor is the
storage span of the recorded view. The metadata entry 'replay.call' is JSON with
op, variant, provider, args, launch and, per tensor key, its geometry; a tensor
stored as a blob has no data here, only its geometry and the blob's hash.
"""
from __future__ import annotations

import functools
import json
import struct
from typing import Any

import safetensors.torch
import torch

from replay.snapshot import schema

META_KEY = "replay.call"
BLOB_KEY = "data"
ROLES = ("in", "out", "state", "tag")


def serialize(header: dict[str, Any], spans: dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save(spans, metadata={META_KEY: json.dumps(header, allow_nan=False)})


def serialize_blob(span: torch.Tensor) -> bytes:
    """A blob file: one tensor under 'data', no metadata (its name is its sha256)."""
    return safetensors.torch.save({BLOB_KEY: span})


@functools.lru_cache(maxsize=8)
def blob_prefix(nbytes: int) -> bytes:
    """What comes before the data in the blob file of `nbytes` uint8 values: a chunk's file is
    this prefix and the chunk's bytes."""
    return serialize_blob(torch.zeros(nbytes, dtype=torch.uint8))[:-nbytes or None]


def read_metadata(data: bytes) -> str:
    """The call description's JSON text from a call file's bytes (raises ValueError if malformed)."""
    if len(data) < 8:
        raise ValueError("file is shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("header runs past the end of the file (truncated?)")
    header = schema.parse(data[8:8 + size], "document")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or not isinstance(meta.get(META_KEY), str):
        raise ValueError(f"no '{META_KEY}' metadata: not a replay call file")
    return meta[META_KEY]


def read_spans(data: bytes) -> dict[str, torch.Tensor]:
    return safetensors.torch.load(data)
