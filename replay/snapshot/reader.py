"""Reading and verifying a snapshot, one call at a time."""
from __future__ import annotations

import json
import re
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

_SHA256 = re.compile(r"[0-9a-f]{64}")


def _one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line (errors are reported as one line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


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
    """A recorded call, read back: tensors are rebuilt views keyed '<role>/<name>'.

    `args` and `returns_json` hold JSON as stored (decode with `arguments()` or
    jsonargs.decode); `blobs` maps the keys of tensors stored as blobs to their digest.
    """

    index: int
    op: str
    variant: str
    provider: str | None
    args: list[dict[str, Any]]
    tensors: dict[str, torch.Tensor]
    launch: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    returns_json: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, str] = field(default_factory=dict)

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
            raise SnapshotError(f"{path}: unreadable manifest: {_one_line(exc)}") from None
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SnapshotError(f"{path}: manifest has no valid format_version (a positive integer)")
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
                raise SnapshotError(f"{path}:{number}: malformed index line: {_one_line(exc)}") from None
        entries.sort(key=lambda e: e.index)
        for before, after in zip(entries, entries[1:]):
            if before.index == after.index:
                raise SnapshotError(f"{path}: call index {after.index} appears more than once")
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

    def _read_verified(self, rel: str, expected_sha: str, expected_bytes: int | None = None) -> bytes:
        path = self.path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise SnapshotError(f"{self.path / INDEX}: refuses path {rel!r} outside the snapshot")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"{path}: missing file listed in the index") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: unreadable: {_one_line(exc)}") from None
        if self.verify and expected_bytes is not None and len(data) != expected_bytes:
            raise SnapshotError(f"{path}: {len(data)} bytes, the index says {expected_bytes} (truncated or corrupt file)")
        if self.verify and sha256_bytes(data) != expected_sha:
            raise SnapshotError(f"{path}: sha256 mismatch (corrupt or truncated file)")
        return data

    def _blob(self, digest: str, referrer: Path) -> torch.Tensor:
        """The span stored in blob `digest` (shared: callers must not modify it)."""
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise SnapshotError(f"{referrer}: blob reference {digest!r} is not a sha256 hex digest")
        cached = self._blob_cache.get(digest)
        if cached is not None:
            self._blob_cache.move_to_end(digest)
            return cached
        rel = blob_relpath(digest)
        data = self._read_verified(rel, digest)
        try:
            span = callfile.read_spans(data)[callfile.BLOB_KEY]
        except Exception as exc:  # safetensors raises several types for bad data
            raise SnapshotError(f"{self.path / rel}: unreadable tensor data: {_one_line(exc)}") from None
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
        data = self._read_verified(entry.file, entry.sha256, entry.bytes)
        try:
            header = callfile.read_header(data)
            spans = callfile.read_spans(data)
        except Exception as exc:  # malformed JSON or safetensors payload
            raise SnapshotError(f"{path}: unreadable call file: {_one_line(exc)}") from None
        _check_header(path, header)
        tensors: dict[str, torch.Tensor] = {}
        for key, geo in header["tensors"].items():
            if not isinstance(geo, dict) or geo.get("dtype") not in DTYPES:
                dtype = geo.get("dtype") if isinstance(geo, dict) else None
                raise SnapshotError(f"{path}: tensor {key!r} has unknown dtype {dtype!r} "
                                    f"(known: {', '.join(DTYPES)})")
            # A blob is shared by many calls: give each call its own copy.
            span = self._blob(geo["blob"], path).clone() if "blob" in geo else spans.get(key)
            if span is None:
                raise SnapshotError(f"{path}: tensor {key!r} is described but not stored")
            try:
                tensors[key] = rebuild(span, Geometry.from_json(geo))
            except (ValueError, RuntimeError, KeyError, TypeError) as exc:
                raise SnapshotError(f"{path}: tensor {key!r}: {_one_line(exc)}") from None
        return CallRecord(index=entry.index, op=header["op"], variant=header["variant"],
                          provider=header.get("provider"), args=header["args"],
                          tensors=tensors, launch=header.get("launch", []),
                          meta=header.get("meta", {}), returns_json=header.get("returns_json", {}),
                          blobs={k: g["blob"] for k, g in header["tensors"].items() if "blob" in g})


def _check_header(path: Path, header: dict[str, Any]) -> None:
    """The call description's required fields have the right types (a clear error if not)."""
    expected = {"op": str, "variant": str, "args": list, "tensors": dict}
    for name, kind in expected.items():
        if not isinstance(header.get(name), kind):
            raise SnapshotError(f"{path}: call metadata field {name!r} is missing or not a {kind.__name__}")
    for arg in header["args"]:
        if not isinstance(arg, dict) or "name" not in arg or ("tensor" in arg) == ("json" in arg):
            raise SnapshotError(f"{path}: malformed argument entry {arg!r} (needs 'name' and one of 'tensor', 'json')")
        if "tensor" in arg and arg["tensor"] not in header["tensors"]:
            raise SnapshotError(f"{path}: argument {arg['name']!r} refers to undescribed tensor {arg['tensor']!r}")
