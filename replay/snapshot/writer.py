"""Writing a snapshot: manifest first, then each call file, its index line last."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile
from replay.snapshot.files import append_line, safe_component, sha256_bytes, write_atomic
from replay.snapshot.manifest import new_manifest
from replay.snapshot.tensors import Geometry

MANIFEST = "manifest.json"
INDEX = "calls.jsonl"
CALLS_DIR = "calls"
BLOBS_DIR = "blobs"


def blob_relpath(digest: str) -> str:
    return f"{BLOBS_DIR}/{digest}.safetensors"


class SnapshotWriter:
    """Appends calls to a new snapshot directory; safe to share between threads."""

    def __init__(self, path: str | Path, *, notes: str = "", source_dir: Path | None = None):
        self.path = Path(path)
        if (self.path / MANIFEST).exists():
            raise SnapshotError(f"{self.path}: already holds a snapshot; record into a new directory")
        (self.path / CALLS_DIR).mkdir(parents=True, exist_ok=True)
        (self.path / BLOBS_DIR).mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._next_index = 0
        self._known_blobs: set[str] = set()
        self.manifest = new_manifest(notes, source_dir)
        self._write_manifest()

    def _write_manifest(self) -> None:
        write_atomic(self.path / MANIFEST, json.dumps(self.manifest, indent=2).encode())

    def reserve_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def put_blob(self, span: torch.Tensor) -> str:
        """Store a read-only tensor span once, by content; return its digest."""
        data = callfile.serialize_blob(span)
        digest = sha256_bytes(data)
        with self._lock:
            if digest in self._known_blobs:
                return digest
        target = self.path / blob_relpath(digest)
        if not target.exists():
            write_atomic(target, data)
        with self._lock:
            self._known_blobs.add(digest)
        return digest

    def write_call(self, index: int, header: dict[str, Any], spans: dict[str, torch.Tensor],
                   geometries: dict[str, Geometry], blobs: dict[str, str]) -> Path:
        """Write call `index`. `spans` holds inline data; `blobs` maps keys to blob digests."""
        header = dict(header, index=index, tensors={
            key: dict(g.to_json(), **({"blob": blobs[key]} if key in blobs else {}))
            for key, g in geometries.items()
        })
        data = callfile.serialize(header, spans)
        rel = f"{CALLS_DIR}/{index:06d}-{safe_component(header['op'])}.safetensors"
        write_atomic(self.path / rel, data)
        line = {"index": index, "op": header["op"], "variant": header["variant"], "file": rel,
                "sha256": sha256_bytes(data), "bytes": len(data),
                "blobs": sorted(set(blobs.values()))}
        with self._lock:
            append_line(self.path / INDEX, json.dumps(line))
        return self.path / rel

    def record_error(self, message: str) -> None:
        with self._lock:
            self.manifest["capture_errors"].append(message)
            self._write_manifest()
