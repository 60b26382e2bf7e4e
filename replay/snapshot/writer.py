"""Writing a snapshot: manifest first, then each call file, its index line last."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile
from replay.snapshot.files import (append_line, create_exclusive, fsync_paths, safe_component, sha256_bytes,
                                  sha256_parts, write_atomic)
from replay.snapshot.manifest import CHUNKED_VERSION, new_manifest
from replay.snapshot.tensors import Geometry

MANIFEST = "manifest.json"
INDEX = "calls.jsonl"
CALLS_DIR = "calls"
BLOBS_DIR = "blobs"
DURABILITY = ("close", "call")
CHUNK_BYTES = 64 * 1024  # a large tensor is stored as blobs of this many bytes (format 2)


def blob_relpath(digest: str) -> str:
    return f"{BLOBS_DIR}/{digest}.safetensors"


def _holds_files(path: Path) -> bool:
    """`path` is a file, or a directory holding a name that does not start with '.'."""
    if not path.is_dir():
        return path.exists()
    return any(not entry.name.startswith(".") for entry in path.iterdir())


def _reason(exc: OSError, path: Path) -> str:
    """An OS error as a short reason, naming the file it concerns when that is outside `path`."""
    reason = exc.strerror or str(exc)
    where = Path(os.fsdecode(exc.filename)) if exc.filename is not None else path
    return reason if where == path or path in where.parents else f"{reason} ({where})"


class SnapshotWriter:
    """Appends calls to a new snapshot directory; safe to share between threads.

    Creating the manifest is exclusive: of two writers started on one directory at once,
    in threads or processes, exactly one gets it and the other raises SnapshotError.

    Every file is written whole under a temporary name and renamed, and a call's index line is
    appended after its file: a killed process leaves only complete calls indexed. `durability`
    says when they reach the disk: "call" flushes each file as it is written; "close" (the
    default) flushes them all once, at close(), which a crash of the process does not need (the
    kernel's page cache outlives it) and a lost machine does.
    """

    def __init__(self, path: str | Path, *, notes: str = "", source_dir: Path | None = None,
                 durability: str = "close"):
        if durability not in DURABILITY:
            raise ValueError(f"durability={durability!r}: must be one of {', '.join(DURABILITY)}")
        self.path = Path(path)
        self._sync = durability == "call"
        self._unsynced: list[Path] = []  # written since the last flush to disk, with durability "close"
        self._lock = threading.Lock()
        self._next_index = 0
        self._known_blobs: set[str] = set()
        self.manifest = new_manifest(notes, source_dir)
        try:
            (self.path / CALLS_DIR).mkdir(parents=True, exist_ok=True)
            (self.path / BLOBS_DIR).mkdir(exist_ok=True)
            # Calls of another recording without a manifest: new calls would reuse their indices.
            leftover = next((name for name in (INDEX, CALLS_DIR, BLOBS_DIR) if _holds_files(self.path / name)), None)
            # Looked at after the leftovers: calls written meanwhile by a writer that got the manifest are its own.
            taken = (self.path / MANIFEST).exists()
            if not taken and leftover is None:
                taken = not create_exclusive(self.path / MANIFEST, self._manifest_bytes())
        except OSError as exc:  # a regular file on the way, a read-only or full file system
            raise SnapshotError(f"{self.path}: cannot record a snapshot here: {_reason(exc, self.path)}") from None
        if taken:
            raise SnapshotError(f"{self.path}: already holds a snapshot; record into a new directory")
        if leftover is not None:
            raise SnapshotError(f"{self.path}: holds {leftover} of an earlier recording but no {MANIFEST}; "
                                "record into a new directory")

    def _manifest_bytes(self) -> bytes:
        return json.dumps(self.manifest, indent=2).encode()

    def _write_manifest(self) -> None:
        write_atomic(self.path / MANIFEST, self._manifest_bytes())

    @property
    def next_index(self) -> int:
        """The index the next call will get."""
        return self._next_index

    def reserve_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def put_blob(self, span: torch.Tensor) -> str:
        """Store a read-only tensor span once, by content; return its digest."""
        data = callfile.serialize_blob(span)
        return self._put(sha256_bytes(data), lambda: data)

    def _put(self, digest: str, data: Callable[[], bytes]) -> str:
        """Write blob `digest` unless it is stored already; `data` makes its bytes when it is not."""
        with self._lock:
            if digest in self._known_blobs:
                return digest
        target = self.path / blob_relpath(digest)
        if not target.exists():
            self._write(target, data())
        with self._lock:
            self._known_blobs.add(digest)
        return digest

    def put_chunks(self, span: torch.Tensor) -> str:
        """Store a tensor span as CHUNK_BYTES pieces of its bytes, each a blob named by its content,
        and the list of their sha256s (a [pieces, 32] uint8 blob) likewise; return the list's
        digest. A piece or a list another call already stored costs nothing."""
        with self._lock:
            if self.manifest["format_version"] < CHUNKED_VERSION:
                self.manifest["format_version"] = CHUNKED_VERSION
                self._write_manifest()
        raw = span.reshape(-1).view(torch.uint8).numpy()
        digests = [self._put_piece(raw[start:start + CHUNK_BYTES]) for start in range(0, len(raw), CHUNK_BYTES)]
        table = torch.frombuffer(bytearray(bytes.fromhex("".join(digests))), dtype=torch.uint8)
        return self.put_blob(table.view(len(digests), 32))

    def _put_piece(self, piece: Any) -> str:
        """put_blob of a run of bytes (a numpy uint8 array), hashed where it lies: only a piece not
        stored yet is copied."""
        prefix = callfile.blob_prefix(len(piece))
        return self._put(sha256_parts(prefix, piece), lambda: prefix + piece.tobytes())

    def _write(self, target: Path, data: bytes) -> None:
        write_atomic(target, data, sync=self._sync)
        if not self._sync:
            with self._lock:
                self._unsynced.append(target)

    def write_call(self, index: int, header: dict[str, Any], spans: dict[str, torch.Tensor],
                   geometries: dict[str, Geometry], blobs: dict[str, str],
                   chunks: dict[str, str] | None = None) -> Path:
        """Write call `index`. `spans` holds inline data; `blobs` maps keys to blob digests and
        `chunks` to the digests of their chunk lists (put_chunks)."""
        chunks = chunks or {}
        header = dict(header, index=index, tensors={
            key: dict(g.to_json(), **({"blob": blobs[key]} if key in blobs else {}),
                      **({"chunks": chunks[key]} if key in chunks else {}))
            for key, g in geometries.items()
        })
        data = callfile.serialize(header, spans)
        rel = f"{CALLS_DIR}/{index:06d}-{safe_component(header['op'])}.safetensors"
        self._write(self.path / rel, data)
        line = {"index": index, "op": header["op"], "variant": header["variant"], "file": rel,
                "sha256": sha256_bytes(data), "bytes": len(data),
                "blobs": sorted({*blobs.values(), *chunks.values()})}
        with self._lock:
            append_line(self.path / INDEX, json.dumps(line), sync=self._sync)
        return self.path / rel

    def close(self) -> None:
        """Flush what durability "close" left in the page cache to disk (index last)."""
        with self._lock:
            pending, self._unsynced = self._unsynced, []
        if pending:
            fsync_paths(pending + [self.path / INDEX])

    def record_error(self, message: str) -> None:
        with self._lock:
            self.manifest["capture_errors"].append(message)
            self._write_manifest()
