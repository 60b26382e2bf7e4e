"""One call file: a safetensors file whose header metadata holds the call's description.

Tensor keys are '<role>/<name>' (role: in, out, state, tag); each stored tensor is the
storage span of the recorded view. The metadata entry 'replay.call' is JSON with
op, variant, provider, args, launch and, per tensor key, its geometry; a tensor
stored as a blob has no data here, only its geometry and the blob's hash.
"""
from __future__ import annotations

import json
import struct
from typing import Any

import safetensors.torch
import torch

META_KEY = "replay.call"
BLOB_KEY = "data"
ROLES = ("in", "out", "state", "tag")


def serialize(header: dict[str, Any], spans: dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save(spans, metadata={META_KEY: json.dumps(header, allow_nan=False)})


def serialize_blob(span: torch.Tensor) -> bytes:
    """A blob file: one tensor under 'data', no metadata (its name is its sha256)."""
    return safetensors.torch.save({BLOB_KEY: span})


def read_header(data: bytes) -> dict[str, Any]:
    """The call description from a call file's bytes (raises ValueError if malformed)."""
    if len(data) < 8:
        raise ValueError("file is shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("header runs past the end of the file (truncated?)")
    header = json.loads(data[8:8 + size])
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or META_KEY not in meta:
        raise ValueError(f"no '{META_KEY}' metadata: not a replay call file")
    call = json.loads(meta[META_KEY])
    if not isinstance(call, dict):
        raise ValueError(f"'{META_KEY}' metadata is not a JSON object")
    return call


def read_spans(data: bytes) -> dict[str, torch.Tensor]:
    return safetensors.torch.load(data)
