"""Reading and verifying a snapshot, one call at a time."""
from __future__ import annotations

import os
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile, jsonargs, schema, unwritten
from replay.snapshot.budget import CallBudget, read_limit_from_env
from replay.snapshot.confined import ConfinedDir, one_line
from replay.snapshot.files import sha256_bytes
from replay.snapshot.manifest import EDITED_LISTS_VERSION, FORMAT_VERSION, PACKED_VERSION, UNWRITTEN_VERSION
from replay.snapshot.packs import PackIndex, read_pack_index, read_piece
from replay.snapshot.segments import SegmentReader
from replay.snapshot.tensors import DTYPES, Geometry, rebuild
from replay.snapshot.piece_packs import pack_relpath
from replay.snapshot.chunk_lists import EDITS_ROLE, ROW as PACKED_ROW, apply_edits, edits_key
from replay.snapshot.writer import INDEX, MANIFEST, RANK_DIR, blob_relpath, source_relpath

MAX_MANIFEST_BYTES = 16 << 20
MAX_INDEX_BYTES = 1 << 30
MAX_SOURCE_BYTES = 16 << 20
PACK_INDEXES_KEPT = 64  # parsed pack headers kept between calls


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
    call: str = ""  # in a segment (format 4), the prefix of the call's keys; '' in a call file


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
    collective: dict[str, Any] | None = None  # a recorded torch.distributed collective: kind, group, rank
    declared: dict[str, Any] | None = None  # an op declared where it was decorated: how to declare it again
    # an output buffer before its call (format 5): the mask of the elements the call left unchanged
    # (its span's), and the view's geometry, for overwritten()
    before_masks: dict[str, tuple[torch.Tensor, Geometry]] = field(default_factory=dict)

    def overwritten(self, key: str) -> torch.Tensor | None:
        """Which elements of tensor `key` its call overwrote (bool, `key`'s shape), where `key` is an
        output buffer before its call (format 5): what they held was not recorded, and the values
        there are filler (unwritten.py); None for every other tensor."""
        found = self.before_masks.get(key)
        if found is None:
            return None
        mask, geometry = found
        return rebuild(unwritten.changed_elements(mask, geometry.span), replace(geometry, dtype="bool"))

    def role(self, role: str) -> dict[str, torch.Tensor]:
        """Tensors of one role ('in', 'out', 'state', 'tag'), by name, in recorded order."""
        prefix = role + "/"
        return {k[len(prefix):]: t for k, t in self.tensors.items() if k.startswith(prefix)}

    @property
    def output_buffers(self) -> frozenset[str]:
        """The keys of the `in/` tensors that are output buffers (a Triton launch's or an operator's
        `write_only` arguments): what they held before the call (torch.empty's leftovers) is no
        input of it."""
        return frozenset(f"in/{name}" for name in (self.triton or self.torch_op or {}).get("write_only", ()))

    def header(self) -> dict[str, Any]:
        """The call's description as a writer takes it (SnapshotWriter.write_tensors): all but its
        index and tensors."""
        return {"op": self.op, "variant": self.variant, "provider": self.provider, "args": self.args,
                "launch": self.launch, "meta": self.meta, "returns_json": self.returns_json,
                **({"triton": self.triton} if self.triton is not None else {}),
                **({"torch_op": self.torch_op} if self.torch_op is not None else {}),
                **({"collective": self.collective} if self.collective is not None else {}),
                **({"declared": self.declared} if self.declared is not None else {})}

    def arguments(self) -> dict[str, Any]:
        """Arguments by name in call order: tensors (inputs and state) and decoded JSON."""
        return {a["name"]: (self.tensors[a["tensor"]] if "tensor" in a else jsonargs.decode(a["json"]))
                for a in self.args}


class Snapshot:
    """A snapshot directory opened for reading. Segments and call files are read only on `load`."""

    def __init__(self, path: str | Path, *, verify: bool = True, blob_cache_bytes: int = 1 << 30,
                 strict: bool = True, read_limit: int | None = None):
        """Open the snapshot at `path`. With `strict` (the default) a damaged index line is a
        SnapshotError; without, it is kept in `problems` (one line each) and the whole lines
        around it are read, so that a caller can replay what is readable and say what is not."""
        self.path = Path(path)
        self.verify = verify
        self.strict = strict
        self.problems: list[str] = []
        self.read_limit = read_limit if read_limit is not None else read_limit_from_env()
        self._blob_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._blob_cache_bytes = blob_cache_bytes
        self._blob_cache_size = 0  # bytes the cache holds
        self._pack_indexes: OrderedDict[int, PackIndex] = OrderedDict()
        self._files = ConfinedDir(self.path, self.path / INDEX, verify)
        self._segments = SegmentReader(self._files)
        self.manifest = self._read_manifest()
        self.entries = self._read_index()

    def _read_manifest(self) -> dict[str, Any]:
        path = self.path / MANIFEST
        data = self._files.read(MANIFEST, limit=MAX_MANIFEST_BYTES, missing=self._why_no_manifest())
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

    def _why_no_manifest(self) -> str:
        ranks = [path.name for path in rank_snapshots(self.path).values()]
        if ranks:  # the parent of a multi-rank recording: a rank is the snapshot
            shown = ", ".join(ranks[:4]) + (", ..." if len(ranks) > 4 else "")
            return f"missing manifest: a multi-rank recording ({shown}); this command reads one rank's snapshot: " \
                   f"{self.path / ranks[0]}"
        return "missing manifest (not a snapshot, or its recording never started)"

    def _read_index(self) -> list[CallEntry]:
        path = self.path / INDEX
        if not os.path.lexists(path):
            return []
        raw = self._files.read(INDEX, limit=MAX_INDEX_BYTES)
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
            call = obj.get("call", "")
            if call and call != callfile.call_prefix(obj["index"]):
                self._problem(f"{path}:{number}: call {obj['index']} names another call's keys ({call!r})")
                continue
            entries.append(CallEntry(obj["index"], obj["op"], obj["variant"], obj["file"], obj["sha256"],
                                     obj["bytes"], tuple(obj.get("blobs", ())), call))
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

    def source(self, digest: str) -> str:
        """The kernel source stored under `digest` (a call's `triton.source_sha256`), its hash
        checked: text to show or compare, never run unless the user trusts it."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise SnapshotError(f"{self.path}: {digest[:80]!r} is not a source's sha256")
        data = self._files.read(source_relpath(digest), limit=MAX_SOURCE_BYTES, missing="missing kernel source")
        if sha256_bytes(data) != digest:
            raise SnapshotError(f"{self.path / source_relpath(digest)}: sha256 mismatch (corrupt or truncated file)")
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise SnapshotError(f"{self.path / source_relpath(digest)}: not UTF-8 text") from None

    def _blob(self, digest: str, budget: CallBudget) -> torch.Tensor:
        """The span stored in blob `digest`, a sha256 the schema checked (shared: callers must not
        modify it), counted once in `budget` as bytes the call stores."""
        cached = self._blob_cache.get(digest)
        if cached is not None:
            self._blob_cache.move_to_end(digest)
            budget.stores(digest, _nbytes(cached))
            return cached
        rel = blob_relpath(digest)
        data = self._files.read_verified(rel, digest)
        try:
            span = callfile.read_spans(data)[callfile.BLOB_KEY]
        except Exception as exc:  # safetensors raises several types for bad data
            raise SnapshotError(f"{self.path / rel}: unreadable tensor data: {one_line(exc)}") from None
        budget.stores(digest, _nbytes(span))
        self._keep_blob(digest, span)
        return span

    def _keep_blob(self, digest: str, span: torch.Tensor) -> None:
        self._blob_cache[digest] = span
        self._blob_cache_size += _nbytes(span)
        while self._blob_cache_size > self._blob_cache_bytes and len(self._blob_cache) > 1:  # oldest first
            _, evicted = self._blob_cache.popitem(last=False)
            self._blob_cache_size -= _nbytes(evicted)

    def _chunked(self, path: Path, key: str, geo: dict[str, Any], budget: CallBudget,
                 spans: dict[str, torch.Tensor]) -> torch.Tensor:
        """A span stored as pieces of its bytes, listed by a blob of their sha256s (format 2: each
        piece a blob) or of their sha256s and packs (format 3: each piece in a pack), that list
        edited by a table among the call's `spans` (format 6), joined again once the budget allows
        what they join to."""
        table = self._blob(geo["chunks"], budget)
        if (table.dtype != torch.uint8 or table.dim() != 2 or table.shape[1] not in (32, PACKED_ROW)
                or table.shape[0] == 0):
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk list is not a [pieces, 32] table of sha256s "
                                f"nor a [pieces, {PACKED_ROW}] table of sha256s and packs")
        rows, width = table.numpy().tobytes(), table.shape[1]
        if width == PACKED_ROW and self.manifest["format_version"] < PACKED_VERSION:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk list names packs, which format version "
                                f"{self.manifest['format_version']} has not")
        if "chunk_edits" in geo:
            rows = self._edited(path, key, spans.get(geo["chunk_edits"]), rows, width)
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

    def _edited(self, path: Path, key: str, edits: torch.Tensor | None, rows: bytes, width: int) -> bytes:
        """A whole chunk list's `rows` with the call's edit list `edits` applied (format 6)."""
        if self.manifest["format_version"] < EDITED_LISTS_VERSION:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk list is edited (\"chunk_edits\"), which format "
                                f"version {self.manifest['format_version']} has not")
        if width != PACKED_ROW:
            raise SnapshotError(f"{path}: tensor {key!r}: its edited chunk list is not a [pieces, {PACKED_ROW}] table")
        if edits is None:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk edit list {edits_key(key)!r} is not stored")
        try:
            return apply_edits(rows, edits.numpy())
        except ValueError as exc:
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk edit list {exc}") from None

    def _before(self, path: Path, key: str, geo: dict[str, Any], stored: dict[str, torch.Tensor],
                budget: CallBudget) -> torch.Tensor:
        """An output buffer's span before the call (format 5): its span after the call where the
        call left an element unchanged, a value that differs elsewhere (replay/snapshot/unwritten.py)."""
        if self.manifest["format_version"] < UNWRITTEN_VERSION:
            raise SnapshotError(f"{path}: tensor {key!r} is made from the call's output (\"before\"), which "
                                f"format version {self.manifest['format_version']} has not")
        after_key, mask_key = geo["before"]["after"], geo["before"]["unchanged"]
        after, mask = stored.get(after_key), stored.get(mask_key)
        if after is None or mask is None:
            missing = after_key if after is None else mask_key
            raise SnapshotError(f"{path}: tensor {key!r} is made from {missing!r}, which is not stored")
        if after.dtype != DTYPES[geo["dtype"]] or after.numel() != Geometry.from_json(geo).span:
            raise SnapshotError(f"{path}: tensor {key!r}: {after_key!r} is not a span of its dtype and length")
        if mask.dtype != torch.uint8 or mask.numel() != unwritten.mask_bytes(after.numel()):
            raise SnapshotError(f"{path}: tensor {key!r}: its mask {mask_key!r} is not "
                                f"{unwritten.mask_bytes(after.numel())} bytes (uint8) for {after.numel()} elements")
        budget.spend(_nbytes(after), f"tensor {key!r}: made from {after_key!r}, it brings it to")
        return unwritten.before_from(after, mask)

    def _packed(self, pack: int, digests: list[str], budget: CallBudget) -> list[torch.Tensor]:
        """The pieces `digests` from pack `pack` (format 3), each digest checked (shared: callers
        must not modify them), each counted once in `budget` as bytes the call stores."""
        keys = [f"{digest}@{pack}" for digest in digests]  # unchecked (verify=False), no stand-in for a blob
        found = {key: self._blob_cache[key] for key in keys if key in self._blob_cache}
        for key in found:
            self._blob_cache.move_to_end(key)
        if len(found) < len(keys):
            with self._files.opened(pack_relpath(pack), "missing pack named by a chunk list") as (fd, size):
                index = self._pack_index(pack, fd, size)
                for digest, key in zip(digests, keys):
                    if key not in found:
                        found[key] = read_piece(index, fd, size, digest, self.verify)
                        self._keep_blob(key, found[key])  # the cache may let it go: `found` keeps it here
        for digest, key in zip(digests, keys):
            budget.stores(digest, _nbytes(found[key]))
        return [found[key] for key in keys]

    def _pack_index(self, pack: int, fd: int, size: int) -> PackIndex:
        """Where each piece of pack `pack` (open as `fd`) lies, its header parsed once while kept."""
        known = self._pack_indexes.get(pack)
        if known is not None:
            self._pack_indexes.move_to_end(pack)
            return known
        index = self._pack_indexes[pack] = read_pack_index(self.path / pack_relpath(pack), fd, size)
        while len(self._pack_indexes) > PACK_INDEXES_KEPT:
            self._pack_indexes.popitem(last=False)
        return index

    def _read_call(self, entry: CallEntry) -> tuple[str, dict[str, torch.Tensor], int]:
        """A call's description (JSON), the tensors stored with it, and its own stored bytes: from
        its segment (format 4) or its call file (formats 1-3)."""
        if entry.call:
            return self._segments.call(entry.file, entry.sha256, entry.bytes, entry.call)
        path = self.path / entry.file
        data = self._files.read_verified(entry.file, entry.sha256, entry.bytes)
        try:
            text = callfile.call_text(callfile.read_metadata(data), "")
        except (ValueError, schema.SchemaError) as exc:
            raise SnapshotError(f"{path}: unreadable call metadata: {one_line(exc)}") from None
        try:
            spans = callfile.read_spans(data)
        except Exception as exc:  # safetensors raises several types for a bad payload
            raise SnapshotError(f"{path}: unreadable call file: {one_line(exc)}") from None
        return text, spans, len(data)

    def describe(self, entry: CallEntry | int) -> dict[str, Any]:
        """A call's description (docs/FORMAT.md's `replay.call`), checked, without its tensors."""
        if isinstance(entry, int):
            entry = self.entry(entry)
        return self._header(entry, self._read_call(entry)[0])

    def _header(self, entry: CallEntry, text: str) -> dict[str, Any]:
        path = self.path / entry.file
        try:
            header = schema.parse(text, "call")
        except schema.SchemaError as exc:
            raise SnapshotError(f"{path}: unreadable call metadata: {one_line(exc)}") from None
        _check_header(path, header)
        return header

    def load(self, entry: CallEntry | int) -> CallRecord:
        if isinstance(entry, int):
            entry = self.entry(entry)
        path = self.path / entry.file
        text, spans, own_bytes = self._read_call(entry)
        header = self._header(entry, text)
        budget = CallBudget(path, own_bytes, self.read_limit)
        stored: dict[str, torch.Tensor] = {}  # spans, as stored
        for key, geo in header["tensors"].items():
            span: torch.Tensor | None  # None: described but not stored
            if "before" in geo:
                continue  # made from others' spans, below
            if "blob" in geo:
                span = self._blob(geo["blob"], budget)
                budget.spend(_nbytes(span), f"tensor {key!r}: its copy of blob {geo['blob'][:12]} brings it to")
                span = span.clone()  # a blob is shared by many calls and tensors: each gets its own copy
            elif "chunks" in geo:
                span = self._chunked(path, key, geo, budget, spans)
            else:
                span = spans.get(key)
            if span is None:
                raise SnapshotError(f"{path}: tensor {key!r} is described but not stored")
            stored[key] = span
        # a mask, or an edit list, is read into the tensor it describes, not a tensor of the call
        masks = {geo["before"]["unchanged"] for geo in header["tensors"].values() if "before" in geo} | {
            geo["chunk_edits"] for geo in header["tensors"].values() if "chunk_edits" in geo}
        tensors: dict[str, torch.Tensor] = {}
        for key, geo in header["tensors"].items():
            if key in masks:
                continue
            span = self._before(path, key, geo, stored, budget) if "before" in geo else stored[key]
            try:
                tensors[key] = rebuild(span, Geometry.from_json(geo))
            except ValueError as exc:
                raise SnapshotError(f"{path}: tensor {key!r}: {one_line(exc)}") from None
            budget.view(_nbytes(tensors[key]), key)
        described = {k: g for k, g in header["tensors"].items() if k not in masks}
        return CallRecord(index=entry.index, op=header["op"], variant=header["variant"],
                          provider=header.get("provider"), args=header["args"],
                          tensors=tensors, launch=header.get("launch", []),
                          meta=header.get("meta", {}), returns_json=header.get("returns_json", {}),
                          blobs={k: g["blob"] for k, g in described.items() if "blob" in g},
                          chunked=frozenset(k for k, g in described.items() if "chunks" in g),
                          recorded_offsets={k: g["storage_offset"] for k, g in described.items()},
                          triton=header.get("triton"), torch_op=header.get("torch_op"),
                          collective=header.get("collective"), declared=header.get("declared"),
                          before_masks={k: (stored[g["before"]["unchanged"]], Geometry.from_json(g))
                                        for k, g in described.items() if "before" in g})


def rank_snapshots(path: Path) -> dict[int, Path]:
    """The rank-<r>/ snapshots directly in `path`, by rank (a multi-rank recording's, docs/FORMAT.md):
    directories holding a manifest; a link is no rank (only what lies inside is read)."""
    try:
        children = list(path.iterdir())
    except OSError:  # not a directory, or unlistable: whoever reads it says so
        return {}
    found = {}
    for child in children:
        match = RANK_DIR.match(child.name)
        if match is not None and not child.is_symlink() and (child / MANIFEST).is_file():
            found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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
            raise SnapshotError(f"{path}: argument {name!r}: {one_line(exc)}") from None
    for key, geo in header["tensors"].items():
        if key.partition("/")[0] not in callfile.KEY_ROLES:
            raise SnapshotError(f"{path}: tensor key {key!r} has no role ({', '.join(callfile.KEY_ROLES)})")
        if "blob" in geo and "chunks" in geo:
            raise SnapshotError(f"{path}: tensor {key!r} names both a blob and chunks")
        if "chunk_edits" in geo and "chunks" not in geo:
            raise SnapshotError(f"{path}: tensor {key!r} names chunk edits but no chunk list they edit")
    _check_edits(path, header)
    _check_befores(path, header)


def _check_edits(path: Path, header: dict[str, Any]) -> None:
    """Format 6's edit lists: `edits/<key>` edits the chunk list of tensor `<key>` alone, is stored
    in the call and is no argument."""
    tensors = header["tensors"]
    for key, geo in tensors.items():
        if "chunk_edits" in geo and geo["chunk_edits"] != edits_key(key):
            raise SnapshotError(f"{path}: tensor {key!r}: its chunk edits must be {edits_key(key)!r}")
        if "chunk_edits" in geo and {"blob", "chunks", "chunk_edits", "before"} & set(tensors.get(edits_key(key), {})):
            raise SnapshotError(f"{path}: tensor {edits_key(key)!r}: an edit list is stored in its call")
    edited = {geo["chunk_edits"] for geo in tensors.values() if "chunk_edits" in geo}
    stray = [key for key in tensors if key.startswith(f"{EDITS_ROLE}/") and key not in edited]
    if stray:
        raise SnapshotError(f"{path}: tensor {stray[0]!r} is the edit list of no tensor's chunks")
    named = [arg["tensor"] for arg in header["args"] if arg.get("tensor", "").startswith(f"{EDITS_ROLE}/")]
    if named:
        raise SnapshotError(f"{path}: an argument names the edit list {named[0]!r}, which is no tensor of the call")


def _check_befores(path: Path, header: dict[str, Any]) -> None:
    """Format 5's output buffers: `in/<name>` made from `out/<name>` and the mask `kept/<name>`
    alone; a mask describes one of them and is no argument."""
    masks = set()
    for key, geo in header["tensors"].items():
        if "before" not in geo:
            continue
        role, _, name = key.partition("/")
        if role != "in" or geo["before"] != {"after": f"out/{name}", "unchanged": f"kept/{name}"}:
            raise SnapshotError(f"{path}: tensor {key!r}: \"before\" must be made from 'out/{name}' and "
                                f"'kept/{name}', and only for an 'in/' tensor")
        if "blob" in geo or "chunks" in geo:
            raise SnapshotError(f"{path}: tensor {key!r} names both stored bytes and \"before\"")
        masks.add(f"kept/{name}")
    stray = [key for key in header["tensors"] if key.startswith("kept/") and key not in masks]
    if stray:
        raise SnapshotError(f"{path}: tensor {stray[0]!r} is the mask of no output buffer")
    named = [arg["tensor"] for arg in header["args"] if arg.get("tensor", "").startswith("kept/")]
    if named:
        raise SnapshotError(f"{path}: an argument names the mask {named[0]!r}, which is no tensor of the call")

