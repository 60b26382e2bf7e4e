"""Reading and verifying a snapshot, one call at a time."""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile, jsonargs
from replay.snapshot.files import sha256_bytes
from replay.snapshot.manifest import FORMAT_VERSION
from replay.snapshot.tensors import DTYPES, Geometry, rebuild
from replay.snapshot.writer import INDEX, MANIFEST, blob_relpath


@dataclass(frozen=True)
class CallEntry:
    """One line of calls.jsonl."""

    index: int
    op: str
    variant: str
    file: str
    sha256: str
    bytes: int
    blobs: tuple[str, ...]


@dataclass
class CallRecord:
    """A recorded call, read back: tensors are rebuilt views keyed '<role>/<name>'."""

    index: int
    op: str
    variant: str
    provider: str | None
    args: list[dict[str, Any]]
    tensors: dict[str, torch.Tensor]
    launch: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def role(self, role: str) -> dict[str, torch.Tensor]:
        """Tensors of one role ('in', 'out', 'state', 'tag'), by name, in recorded order."""
        prefix = role + "/"
        return {k[len(prefix):]: t for k, t in self.tensors.items() if k.startswith(prefix)}

    def arguments(self) -> dict[str, Any]:
        """Arguments by name in call order: tensors (inputs and state) and decoded JSON."""
        return {a["name"]: (self.tensors[a["tensor"]] if "tensor" in a else jsonargs.decode(a["json"]))
                for a in self.args}


class Snapshot:
    """A snapshot directory opened for reading. Call files are read only on `load`."""

    def __init__(self, path: str | Path, *, verify: bool = True, blob_cache_bytes: int = 1 << 30):
        self.path = Path(path)
        self.verify = verify
        self._blob_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._blob_cache_bytes = blob_cache_bytes
        if not self.path.is_dir():
            raise SnapshotError(f"{self.path}: no such snapshot directory")
        self.manifest = self._read_manifest()
        self.entries = self._read_index()

    def _read_manifest(self) -> dict[str, Any]:
        path = self.path / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            raise SnapshotError(f"{path}: missing manifest (not a snapshot, or its recording never started)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{path}: unreadable manifest: {exc}") from None
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        if not isinstance(version, int):
            raise SnapshotError(f"{path}: manifest has no integer format_version")
        if version > FORMAT_VERSION:
            raise SnapshotError(f"{path}: format version {version} is newer than this tool reads "
                                f"({FORMAT_VERSION}); upgrade kernel-replay")
        return manifest

    def _read_index(self) -> list[CallEntry]:
        path = self.path / INDEX
        if not path.exists():
            return []
        raw = path.read_bytes()
        lines = raw.split(b"\n")
        # A line without its newline was cut off mid-append: that call never finished.
        complete = lines[:-1]
        entries = []
        for number, line in enumerate(complete, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                entries.append(CallEntry(int(obj["index"]), str(obj["op"]), str(obj["variant"]),
                                         str(obj["file"]), str(obj["sha256"]), int(obj["bytes"]),
                                         tuple(obj.get("blobs", ()))))
            except (ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{path}:{number}: malformed index line: {exc}") from None
        entries.sort(key=lambda e: e.index)
        return entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[CallRecord]:
        for entry in self.entries:
            yield self.load(entry)

    def entry(self, index: int) -> CallEntry:
        for e in self.entries:
            if e.index == index:
                return e
        raise SnapshotError(f"{self.path}: no call with index {index} "
                            f"(calls {self.entries[0].index}..{self.entries[-1].index})" if self.entries
                            else f"{self.path}: snapshot has no calls")

    def _read_verified(self, rel: str, expected_sha: str) -> bytes:
        path = self.path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise SnapshotError(f"{self.path / INDEX}: refuses path {rel!r} outside the snapshot")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"{path}: missing file listed in the index") from None
        if self.verify and sha256_bytes(data) != expected_sha:
            raise SnapshotError(f"{path}: sha256 mismatch (corrupt or truncated file)")
        return data

    def _blob(self, digest: str) -> torch.Tensor:
        cached = self._blob_cache.get(digest)
        if cached is not None:
            self._blob_cache.move_to_end(digest)
            return cached
        rel = blob_relpath(digest)
        data = self._read_verified(rel, digest)
        try:
            span = callfile.read_spans(data)["data"]
        except Exception as exc:  # safetensors raises several types for bad data
            raise SnapshotError(f"{self.path / rel}: unreadable tensor data: {exc}") from None
        self._blob_cache[digest] = span
        size = 0
        for key in reversed(list(self._blob_cache)):
            size += self._blob_cache[key].numel() * self._blob_cache[key].element_size()
            if size > self._blob_cache_bytes and key != digest:
                del self._blob_cache[key]
        return span

    def load(self, entry: CallEntry | int) -> CallRecord:
        if isinstance(entry, int):
            entry = self.entry(entry)
        path = self.path / entry.file
        data = self._read_verified(entry.file, entry.sha256)
        try:
            header = callfile.read_header(data)
            spans = callfile.read_spans(data)
        except Exception as exc:  # malformed JSON or safetensors payload
            raise SnapshotError(f"{path}: unreadable call file: {exc}") from None
        tensors: dict[str, torch.Tensor] = {}
        for key, geo in header.get("tensors", {}).items():
            if geo.get("dtype") not in DTYPES:
                raise SnapshotError(f"{path}: tensor {key!r} has unknown dtype {geo.get('dtype')!r}")
            span = self._blob(geo["blob"]) if "blob" in geo else spans.get(key)
            if span is None:
                raise SnapshotError(f"{path}: tensor {key!r} is described but not stored")
            try:
                tensors[key] = rebuild(span, Geometry.from_json(geo))
            except (ValueError, RuntimeError) as exc:
                raise SnapshotError(f"{path}: tensor {key!r}: {exc}") from None
        return CallRecord(index=entry.index, op=header["op"], variant=header["variant"],
                          provider=header.get("provider"), args=header.get("args", []),
                          tensors=tensors, launch=header.get("launch", []),
                          meta=header.get("meta", {}))
