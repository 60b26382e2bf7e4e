"""Reading and verifying a snapshot, one call at a time."""
from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from replay import settings
from replay.errors import SnapshotError
from replay.snapshot import callfile, jsonargs, schema
from replay.snapshot.files import sha256_bytes, sha256_parts
from replay.snapshot.manifest import FORMAT_VERSION, PACKED_VERSION
from replay.snapshot.tensors import DTYPES, Geometry, rebuild
from replay.snapshot.writer import INDEX, MANIFEST, PACKED_ROW, blob_relpath, pack_relpath, source_relpath

MAX_MANIFEST_BYTES = 16 << 20
MAX_INDEX_BYTES = 1 << 30
MAX_BLOB_BYTES = 1 << 40
MAX_SOURCE_BYTES = 16 << 20
MAX_PACK_HEADER_BYTES = 64 << 20  # ~100 bytes a piece: a pack of 40 GB of 64 KiB pieces
PACK_INDEXES_KEPT = 64  # parsed pack headers kept between calls
# What reading one call may cost in memory: the tensors it makes (blob copies, joined chunks) and
# the views it hands out may each reach CALL_VIEW_RATIO times the distinct bytes the call stores on
# disk (its file, and each blob or chunk it names, once however often it is named), or
# settings.READ_LIMIT_MIB, whichever is larger (raised for a large tensor stored as a few pieces:
# a KV cache still mostly zeros).
CALL_VIEW_RATIO = 64
# a file whose size is mostly holes would cost memory its disk blocks do not: refused past this size
SPARSE_SLACK = 1 << 20


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
    chunked: frozenset[str] = frozenset()  # the keys of tensors stored as chunks (formats 2 and 3)
    # as recorded: a far offset is rebuilt nearer (docs/FORMAT.md), so a tensor's own may differ
    recorded_offsets: dict[str, int] = field(default_factory=dict)
    triton: dict[str, Any] | None = None  # a recorded Triton launch: grid, options, config (docs/FORMAT.md)
    torch_op: dict[str, Any] | None = None  # a recorded PyTorch operator call: its typed and list arguments

    def role(self, role: str) -> dict[str, torch.Tensor]:
        """Tensors of one role ('in', 'out', 'state', 'tag'), by name, in recorded order."""
        prefix = role + "/"
        return {k[len(prefix):]: t for k, t in self.tensors.items() if k.startswith(prefix)}

    def header(self) -> dict[str, Any]:
        """The call's description as a writer takes it (SnapshotWriter.write_tensors): all but its
        index and tensors."""
        return {"op": self.op, "variant": self.variant, "provider": self.provider, "args": self.args,
                "launch": self.launch, "meta": self.meta, "returns_json": self.returns_json,
                **({"triton": self.triton} if self.triton is not None else {}),
                **({"torch_op": self.torch_op} if self.torch_op is not None else {})}

    def arguments(self) -> dict[str, Any]:
        """Arguments by name in call order: tensors (inputs and state) and decoded JSON."""
        return {a["name"]: (self.tensors[a["tensor"]] if "tensor" in a else jsonargs.decode(a["json"]))
                for a in self.args}


class Snapshot:
    """A snapshot directory opened for reading. Call files are read only on `load`."""

    def __init__(self, path: str | Path, *, verify: bool = True, blob_cache_bytes: int = 1 << 30,
                 strict: bool = True, read_limit: int | None = None):
        """Open the snapshot at `path`. With `strict` (the default) a damaged index line is a
        SnapshotError; without, it is kept in `problems` (one line each) and the whole lines
        around it are read, so that a caller can replay what is readable and say what is not."""
        self.path = Path(path)
        self.verify = verify
        self.strict = strict
        self.problems: list[str] = []
        self.read_limit = read_limit if read_limit is not None else _read_limit_from_env()
        self._blob_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._blob_cache_bytes = blob_cache_bytes
        self._blob_cache_size = 0  # bytes the cache holds
        self._pack_indexes: OrderedDict[int, _PackIndex] = OrderedDict()
        try:
            if not self.path.is_dir():
                what = "a file, not a snapshot directory" if self.path.exists() else "no such snapshot directory"
                raise SnapshotError(f"{self.path}: {what}")
            self._root = os.path.realpath(self.path)
        except (OSError, ValueError) as exc:  # a NUL byte or an unreachable path
            raise SnapshotError(f"{self.path}: not a readable directory: {_one_line(exc)}") from None
        self.manifest = self._read_manifest()
        self.entries = self._read_index()

    def _read_manifest(self) -> dict[str, Any]:
        path = self.path / MANIFEST
        data = self._read_file(MANIFEST, limit=MAX_MANIFEST_BYTES, missing="missing manifest (not a snapshot, "
                               "or its recording never started)")
        try:
            manifest = schema.parse(data, "document")  # the version first: a newer format has other shapes
        except schema.SchemaError as exc:
            raise SnapshotError(f"{path}: unreadable manifest: {exc}") from None
        version = manifest.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SnapshotError(f"{path}: manifest has no valid format_version (a positive integer)")
        if version > FORMAT_VERSION:
            raise SnapshotError(f"{path}: format version {version} is newer than this tool reads "
                                f"({FORMAT_VERSION}); upgrade kernel-replay")
        try:
            schema.validate(manifest, "manifest")
        except schema.SchemaError as exc:
            raise SnapshotError(f"{path}: malformed manifest: {exc}") from None
        return manifest

    def _read_index(self) -> list[CallEntry]:
        path = self.path / INDEX
        if not os.path.lexists(path):
            return []
        raw = self._read_file(INDEX, limit=MAX_INDEX_BYTES)
        lines = raw.split(b"\n")
        if lines[-1].strip():  # no newline after it: its write was cut short, its call never indexed
            self._problem(f"{path}:{len(lines)}: the last line is cut short ({len(lines[-1])} bytes, no newline): "
                          "its call is not indexed")
        entries = []
        for number, line in enumerate(lines[:-1], start=1):
            if not line.strip():
                continue
            try:
                obj = schema.parse(line, "index_line")
            except schema.SchemaError as exc:
                self._problem(f"{path}:{number}: malformed index line: {exc}")
                continue
            entries.append(CallEntry(obj["index"], obj["op"], obj["variant"], obj["file"], obj["sha256"],
                                     obj["bytes"], tuple(obj.get("blobs", ()))))
        entries.sort(key=lambda e: e.index)
        for before, after in zip(entries, entries[1:]):
            if before.index == after.index:
                raise SnapshotError(f"{path}: call index {after.index} appears more than once")
        return entries

    def _problem(self, message: str) -> None:
        if self.strict:
            raise SnapshotError(message)
        self.problems.append(message)

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

    def _read_file(self, rel: str, *, limit: int, exact: bool = False,
                   missing: str = "missing file listed in the index") -> bytes:
        """The bytes of `rel`: a regular file whose real path lies inside the snapshot, at most
        `limit` bytes (exactly `limit` when `exact`); never a link out, a device or a FIFO."""
        path = self.path / rel
        with self._opened(rel, missing) as (fd, size):
            if size > limit or (exact and self.verify and size != limit):
                raise SnapshotError(f"{path}: {size} bytes, "
                                    + (f"the index says {limit} (truncated or corrupt file)" if exact
                                       else f"more than the {limit} this file may hold"))
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(size)  # what fstat saw, even if the file grows meanwhile

    @contextlib.contextmanager
    def _opened(self, rel: str, missing: str) -> Iterator[tuple[int, int]]:
        """`rel` opened for reading, with its size: a regular file whose real path lies inside the
        snapshot, not mostly holes; never a link out, a device or a FIFO."""
        path = self.path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise SnapshotError(f"{self.path / INDEX}: refuses path {rel!r} outside the snapshot")
        real = os.path.realpath(path)
        if not real.startswith(self._root + os.sep):
            raise SnapshotError(f"{path}: leads outside the snapshot (to {real}); refused")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise SnapshotError(f"{path}: {missing}") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: unreadable: {_one_line(exc)}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SnapshotError(f"{path}: not a regular file; refused")
            if info.st_size > SPARSE_SLACK and info.st_blocks * 512 < info.st_size // 2:
                raise SnapshotError(f"{path}: a sparse file ({info.st_size} bytes, {info.st_blocks * 512} on disk); "
                                    "refused")
            yield fd, info.st_size
        finally:
            os.close(fd)

    def _read_verified(self, rel: str, expected_sha: str, expected_bytes: int | None = None) -> bytes:
        path = self.path / rel
        if expected_bytes is None:
            data = self._read_file(rel, limit=MAX_BLOB_BYTES)
        else:
            data = self._read_file(rel, limit=expected_bytes, exact=True)
        if self.verify and sha256_bytes(data) != expected_sha:
            raise SnapshotError(f"{path}: sha256 mismatch (corrupt or truncated file)")
        return data

    def source(self, digest: str) -> str:
        """The kernel source stored under `digest` (a call's `triton.source_sha256`), its hash
        checked: text to show or compare, never run unless the user trusts it."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise SnapshotError(f"{self.path}: {digest[:80]!r} is not a source's sha256")
        data = self._read_file(source_relpath(digest), limit=MAX_SOURCE_BYTES, missing="missing kernel source")
        if sha256_bytes(data) != digest:
            raise SnapshotError(f"{self.path / source_relpath(digest)}: sha256 mismatch (corrupt or truncated file)")
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise SnapshotError(f"{self.path / source_relpath(digest)}: not UTF-8 text") from None

    def _blob(self, digest: str, budget: _Budget) -> torch.Tensor:
        """The span stored in blob `digest`, a sha256 the schema checked (shared: callers must not
        modify it), counted once in `budget` as bytes the call stores."""
        cached = self._blob_cache.get(digest)
        if cached is not None:
            self._blob_cache.move_to_end(digest)
            budget.stores(digest, _nbytes(cached))
            return cached
        rel = blob_relpath(digest)
        data = self._read_verified(rel, digest)
        try:
            span = callfile.read_spans(data)[callfile.BLOB_KEY]
        except Exception as exc:  # safetensors raises several types for bad data
            raise SnapshotError(f"{self.path / rel}: unreadable tensor data: {_one_line(exc)}") from None
        budget.stores(digest, _nbytes(span))
        self._keep_blob(digest, span)
        return span

    def _keep_blob(self, digest: str, span: torch.Tensor) -> None:
        self._blob_cache[digest] = span
        self._blob_cache_size += _nbytes(span)
        while self._blob_cache_size > self._blob_cache_bytes and len(self._blob_cache) > 1:  # oldest first
            _, evicted = self._blob_cache.popitem(last=False)
            self._blob_cache_size -= _nbytes(evicted)

    def _chunked(self, path: Path, key: str, geo: dict[str, Any], budget: _Budget) -> torch.Tensor:
        """A span stored as pieces of its bytes, listed by a blob of their sha256s (format 2: each
        piece a blob) or of their sha256s and packs (format 3: each piece in a pack), joined again
        once the budget allows what they join to."""
        table = self._blob(geo["chunks"], budget)
        if (table.dtype != torch.uint8 or table.dim() != 2 or table.shape[1] not in (32, PACKED_ROW)
                or table.shape[0] == 0):
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk list is not a [pieces, 32] table of sha256s "
                                f"nor a [pieces, {PACKED_ROW}] table of sha256s and packs")
        rows, width = table.numpy().tobytes(), table.shape[1]
        if width == PACKED_ROW and self.manifest["format_version"] < PACKED_VERSION:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk list names packs, which format version "
                                f"{self.manifest['format_version']} has not")
        listed: list[tuple[str, int | None]] = [
            (rows[at:at + 32].hex(), struct.unpack("<I", rows[at + 32:at + width])[0] if width > 32 else None)
            for at in range(0, len(rows), width)]
        pieces: dict[tuple[str, int | None], torch.Tensor] = {}
        in_packs: dict[int, list[str]] = {}  # pack -> the pieces wanted from it: each pack opened once a tensor
        for digest, pack in dict.fromkeys(listed):
            if pack is None:
                pieces[digest, None] = self._blob(digest, budget)
            else:
                in_packs.setdefault(pack, []).append(digest)
        for pack, digests in in_packs.items():
            pieces.update(((digest, pack), piece) for digest, piece in zip(digests, self._packed(pack, digests, budget)))
        if any(piece.dtype != torch.uint8 or piece.dim() != 1 for piece in pieces.values()):
            raise SnapshotError(f"{path}: tensor {key!r}: a chunk is not a run of bytes")
        # pieces repeat (a cache of zero pages is one piece), but a piece listed many times must not
        # blow memory up: the join is paid for from the call's budget before it is made
        budget.spend(sum(pieces[row].numel() for row in listed), f"tensor {key!r}: its chunks join to")
        joined = torch.cat([pieces[row] for row in listed])
        itemsize = torch.empty(0, dtype=DTYPES[geo["dtype"]]).element_size()
        if joined.numel() % itemsize:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunks hold {joined.numel()} bytes, not a whole "
                                f"number of {geo['dtype']} values")
        return joined.view(DTYPES[geo["dtype"]])

    def _packed(self, pack: int, digests: list[str], budget: _Budget) -> list[torch.Tensor]:
        """The pieces `digests` from pack `pack` (format 3), each digest checked (shared: callers
        must not modify them), each counted once in `budget` as bytes the call stores."""
        keys = [f"{digest}@{pack}" for digest in digests]  # unchecked (verify=False), no stand-in for a blob
        found = {key: self._blob_cache[key] for key in keys if key in self._blob_cache}
        for key in found:
            self._blob_cache.move_to_end(key)
        if len(found) < len(keys):
            index = self._pack_index(pack)
            with self._opened(pack_relpath(pack), "missing pack named by a chunk list") as (fd, size):
                for digest, key in zip(digests, keys):
                    if key not in found:
                        found[key] = self._read_piece(index, fd, size, digest)
                        self._keep_blob(key, found[key])  # the cache may let it go: `found` keeps it here
        for digest, key in zip(digests, keys):
            budget.stores(digest, _nbytes(found[key]))
        return [found[key] for key in keys]

    def _read_piece(self, index: _PackIndex, fd: int, size: int, digest: str) -> torch.Tensor:
        where = index.pieces.get(digest)
        if where is None:
            raise SnapshotError(f"{index.path}: holds no chunk {digest[:12]} (a chunk list names it there)")
        start, length = where
        data = os.pread(fd, length, start) if start + length <= size else b""
        if len(data) != length:
            raise SnapshotError(f"{index.path}: chunk {digest[:12]} runs past the end of the file (truncated?)")
        if self.verify and sha256_parts(callfile.blob_prefix(length), data) != digest:
            raise SnapshotError(f"{index.path}: chunk {digest[:12]}: sha256 mismatch (corrupt or tampered)")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if length else torch.empty(0, dtype=torch.uint8)

    def _pack_index(self, pack: int) -> _PackIndex:
        """Where each piece of pack `pack` lies, from its safetensors header, checked: 1-D U8
        tensors named by sha256, lying inside the file."""
        known = self._pack_indexes.get(pack)
        if known is not None:
            self._pack_indexes.move_to_end(pack)
            return known
        rel = pack_relpath(pack)
        path = self.path / rel
        with self._opened(rel, "missing pack named by a chunk list") as (fd, size):
            head = os.pread(fd, 8, 0)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
            if length is None or length > MAX_PACK_HEADER_BYTES or 8 + length > size:
                raise SnapshotError(f"{path}: not a pack: its header is cut short or larger than "
                                    f"{MAX_PACK_HEADER_BYTES} bytes")
            text = os.pread(fd, length, 8)
        try:
            header = schema.parse(text, "document")
        except schema.SchemaError as exc:
            raise SnapshotError(f"{path}: unreadable pack header: {exc}") from None
        base, pieces = 8 + length, {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
            if (not isinstance(entry, dict) or not re.fullmatch(r"[0-9a-f]{64}", name) or entry.get("dtype") != "U8"
                    or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                    or entry.get("shape") != [offsets[1] - offsets[0]] or not 0 <= offsets[0] <= offsets[1]
                    or base + offsets[1] > size):
                raise SnapshotError(f"{path}: pack entry {name[:80]!r} is not a run of bytes named by its sha256 "
                                    "lying inside the file")
            pieces[name] = (base + offsets[0], offsets[1] - offsets[0])
        ranges = sorted(pieces.values())
        if any(start + count > after for (start, count), (after, _) in zip(ranges, ranges[1:])):
            # overlapping pieces would let a small pack read as many times its size
            raise SnapshotError(f"{path}: pack entries overlap")
        index = _PackIndex(path, pieces)
        self._pack_indexes[pack] = index
        while len(self._pack_indexes) > PACK_INDEXES_KEPT:
            self._pack_indexes.popitem(last=False)
        return index

    def load(self, entry: CallEntry | int) -> CallRecord:
        if isinstance(entry, int):
            entry = self.entry(entry)
        path = self.path / entry.file
        data = self._read_verified(entry.file, entry.sha256, entry.bytes)
        try:
            header = schema.parse(callfile.read_metadata(data), "call")
        except (ValueError, schema.SchemaError) as exc:
            raise SnapshotError(f"{path}: unreadable call metadata: {_one_line(exc)}") from None
        _check_header(path, header)
        try:
            spans = callfile.read_spans(data)
        except Exception as exc:  # safetensors raises several types for a bad payload
            raise SnapshotError(f"{path}: unreadable call file: {_one_line(exc)}") from None
        tensors: dict[str, torch.Tensor] = {}
        budget = _Budget(path, len(data), self.read_limit)
        for key, geo in header["tensors"].items():
            span: torch.Tensor | None  # None: described but not stored
            if "blob" in geo:
                span = self._blob(geo["blob"], budget)
                budget.spend(_nbytes(span), f"tensor {key!r}: its copy of blob {geo['blob'][:12]} brings it to")
                span = span.clone()  # a blob is shared by many calls and tensors: each gets its own copy
            elif "chunks" in geo:
                span = self._chunked(path, key, geo, budget)
            else:
                span = spans.get(key)
            if span is None:
                raise SnapshotError(f"{path}: tensor {key!r} is described but not stored")
            try:
                tensors[key] = rebuild(span, Geometry.from_json(geo))
            except ValueError as exc:
                raise SnapshotError(f"{path}: tensor {key!r}: {_one_line(exc)}") from None
            budget.view(_nbytes(tensors[key]), key)
        return CallRecord(index=entry.index, op=header["op"], variant=header["variant"],
                          provider=header.get("provider"), args=header["args"],
                          tensors=tensors, launch=header.get("launch", []),
                          meta=header.get("meta", {}), returns_json=header.get("returns_json", {}),
                          blobs={k: g["blob"] for k, g in header["tensors"].items() if "blob" in g},
                          chunked=frozenset(k for k, g in header["tensors"].items() if "chunks" in g),
                          recorded_offsets={k: g["storage_offset"] for k, g in header["tensors"].items()},
                          triton=header.get("triton"), torch_op=header.get("torch_op"))


@dataclass(frozen=True)
class _PackIndex:
    path: Path
    pieces: dict[str, tuple[int, int]]  # a piece's digest -> (where its bytes start in the file, how many)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _read_limit_from_env() -> int:
    return settings.READ_LIMIT_MIB.get() << 20


class _Budget:
    """What reading one call may cost in memory (CALL_VIEW_RATIO): what it makes, and what its
    views reach, each at most CALL_VIEW_RATIO times the distinct bytes it stores, or `floor`."""

    def __init__(self, path: Path, file_bytes: int, floor: int):
        self.path, self.floor = path, floor
        self.stored, self.made, self.viewed = file_bytes, 0, 0
        self._seen: set[str] = set()

    @property
    def limit(self) -> int:
        return max(CALL_VIEW_RATIO * self.stored, self.floor)

    def stores(self, digest: str, nbytes: int) -> None:
        """Blob `digest` is read for this call: its bytes count once, however often it is named."""
        if digest not in self._seen:
            self._seen.add(digest)
            self.stored += nbytes

    def spend(self, nbytes: int, what: str) -> None:
        """Memory about to be made for the call (`what` ends 'brings it to' or 'joins to')."""
        self.made += nbytes
        if self.made > self.limit:
            raise SnapshotError(f"{self.path}: {what} {self.made} bytes in memory, more than the {self.limit} its "
                                f"{self.stored} distinct stored bytes allow ({CALL_VIEW_RATIO} times, or "
                                f"REPLAY_READ_LIMIT_MIB); refused")

    def view(self, nbytes: int, key: str) -> None:
        self.viewed += nbytes
        if self.viewed > self.limit:
            raise SnapshotError(f"{self.path}: its views reach {self.viewed} bytes by tensor {key!r}, more than "
                                f"the {self.limit} its {self.stored} distinct stored bytes allow; refused")


def _check_header(path: Path, header: dict[str, Any]) -> None:
    """What the schema cannot say: each argument is a tensor or JSON, tensors it names are
    described, JSON values decode, and names are unique."""
    seen = set()
    for arg in header["args"]:
        name = arg["name"]
        if ("tensor" in arg) == ("json" in arg):
            raise SnapshotError(f"{path}: argument {name!r} needs exactly one of 'tensor' and 'json'")
        if name in seen:
            raise SnapshotError(f"{path}: argument {name!r} appears twice")
        seen.add(name)
        if "tensor" in arg and arg["tensor"] not in header["tensors"]:
            raise SnapshotError(f"{path}: argument {name!r} refers to undescribed tensor {arg['tensor']!r}")
        try:
            jsonargs.decode(arg.get("json"))
        except ValueError as exc:
            raise SnapshotError(f"{path}: argument {name!r}: {_one_line(exc)}") from None
    for key, geo in header["tensors"].items():
        if key.partition("/")[0] not in callfile.ROLES:
            raise SnapshotError(f"{path}: tensor key {key!r} has no role ({', '.join(callfile.ROLES)})")
        if "blob" in geo and "chunks" in geo:
            raise SnapshotError(f"{path}: tensor {key!r} names both a blob and chunks")

