"""Writing a snapshot: manifest first, then segments of calls, their index lines last."""
from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Sequence

import numpy as np
import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile, chunk_lists, hashing, schema
from replay.snapshot.chunk_lists import ChunkList
from replay.snapshot.files import create_exclusive, fsync_paths, sha256_parts, write_atomic
from replay.snapshot.manifest import git_state, new_manifest
from replay.snapshot.piece_packs import PACKS_DIR, PiecePacks
from replay.snapshot.tensors import Geometry, geometry_of, storage_span

MANIFEST = "manifest.json"
INDEX = "calls.jsonl"
RANK_DIR = re.compile(r"^rank-(\d{1,6})$")  # a multi-rank recording's snapshot of one rank (docs/FORMAT.md)
CALLS_DIR = "calls"  # formats 1-3: a file a call
SEGMENTS_DIR = "segments"  # format 4: many calls a file
BLOBS_DIR = "blobs"
SOURCES_DIR = "sources"
DURABILITY = ("close", "call")
CHUNK_BYTES = 64 * 1024  # a large tensor is stored in pieces of this many bytes (formats 2 and 3)
HASH_WHILE_WRITING_BYTES = 16 << 20  # blobs this large are hashed on a thread of their own as they are written
SEGMENT_HASH_WHILE_WRITING_BYTES = 1 << 20  # and segments this large (a thread costs more than a smaller hash)
# A read-only input of a call that writes a tensor stored in pieces may be stored in pieces itself
# (put_read_only) when it is a piece or more and smaller than this: a decode step's new K/V row is
# the piece its cache holds after the step, stored once. A larger one stays a blob, hashed as it is
# written (pieces hashed first and packed after cost the 7B MLP block twice: docs/PERFORMANCE.md)
PIECED_READ_ONLY_BYTES = 1 << 20


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written: a short count carries on where it stopped, a count of
    none is a full disk."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no room to write the index line", None)
        view = view[written:]


def _hashed_while(write: Callable[[], None], parts: Sequence[Any]) -> str:
    """The sha256 of `parts`, taken on another thread while `write()` writes them: both let go of
    the interpreter lock, so it costs the slower of the two, not both; one after the other where
    the interpreter is exiting (a recording closed at exit), as no thread takes work then."""
    hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replay-hash-while-writing")
    try:
        digest = hasher.submit(sha256_parts, *parts)
    except RuntimeError:
        write()
        return sha256_parts(*parts)
    with hasher:
        write()
    return digest.result()


def blob_relpath(digest: str) -> str:
    return f"{BLOBS_DIR}/{digest}.safetensors"


def segment_relpath(number: int) -> str:
    return f"{SEGMENTS_DIR}/{number:08d}.safetensors"


def source_relpath(digest: str) -> str:
    return f"{SOURCES_DIR}/{digest}.py"


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


@dataclass
class CallPart:
    """A call ready for a segment: its description (geometry of every tensor included), the
    spans stored in the segment itself, and the blobs and chunk lists it names."""
    index: int
    op: str
    variant: str
    description: str  # the header's JSON
    spans: dict[str, torch.Tensor]
    blobs: list[str]

    @property
    def nbytes(self) -> int:
        """What the call adds to a segment."""
        return len(self.description) + sum(span.numel() * span.element_size() for span in self.spans.values())


class SnapshotWriter:
    """Appends calls to a new snapshot directory; safe to share between threads.

    Creating the manifest is exclusive: of two writers started on one directory at once,
    in threads or processes, exactly one gets it and the other raises SnapshotError.

    Every file is written whole under a temporary name and renamed, and a call's index line is
    appended after its segment: a killed process leaves only complete calls indexed. `durability`
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
        self._index_fd: int | None = None
        self._index_size = 0  # bytes of whole lines in the index: where a failed append is cut back to
        self._manifest_stale = False  # an error recorded in memory that the manifest does not hold yet
        self._manifest_unsynced = False  # written again since it was created, not yet flushed to disk
        self.unsaved_errors: OSError | None = None  # why, after close(), the manifest still does not
        self._known_blobs: set[str] = set()
        self._packs = PiecePacks(self.path, self._write)
        # a lineage's last whole chunk list of each length (its digest and rows), which its next stores may edit
        self._list_bases: dict[tuple[Hashable, int], tuple[str, np.ndarray]] = {}
        self._segments = 0  # segments written
        # the git state is read on a thread of its own and written into the manifest once known:
        # two `git` runs would cost every recording a few milliseconds before its first call
        self.manifest = new_manifest(schema.as_text(notes), source_dir, with_git=False)
        self._git_reader = threading.Thread(target=self._read_git_state, args=(source_dir or Path.cwd(),),
                                            name="replay-git-state", daemon=True)
        try:
            (self.path / SEGMENTS_DIR).mkdir(parents=True, exist_ok=True)
            (self.path / BLOBS_DIR).mkdir(exist_ok=True)
            # Calls of another recording without a manifest: new calls would reuse their indices.
            leftover = next((name for name in (INDEX, CALLS_DIR, SEGMENTS_DIR, BLOBS_DIR, PACKS_DIR)
                             if _holds_files(self.path / name)), None)
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
        self._git_reader.start()

    def _read_git_state(self, source_dir: Path) -> None:
        state = git_state(source_dir)
        if state is None:  # no git work tree: the manifest's None says so (as it does until this is read)
            return
        with self._lock:
            self.manifest["producer"]["git"] = state
            self._manifest_stale = True
        with contextlib.suppress(OSError):  # a full disk: tried again at close
            self._rewrite_manifest()

    def _manifest_bytes(self) -> bytes:
        return json.dumps(self.manifest, indent=2).encode()

    def _write_manifest(self) -> None:
        """Write the manifest again (holding the lock): flushed to disk now, or at close() with
        durability "close", as every other file."""
        write_atomic(self.path / MANIFEST, self._manifest_bytes(), sync=self._sync)
        self._manifest_unsynced = not self._sync

    @property
    def next_index(self) -> int:
        """The index the next call will get."""
        return self._next_index

    def reserve_index(self, count: int = 1) -> int:
        """The first of `count` indexes, handed out to no one else."""
        with self._lock:
            index = self._next_index
            self._next_index += count
            return index

    def put_blob(self, span: torch.Tensor) -> str:
        """Store a read-only tensor span once, by content; return its digest."""
        parts = callfile.serialize_blob(span)
        if span.numel() * span.element_size() >= HASH_WHILE_WRITING_BYTES:
            return self._put_hashed_while_written(parts)
        return self._put(sha256_parts(*parts), lambda target: self._write(target, parts))

    def put_read_only(self, span: torch.Tensor, pieced: bool, lineage: Hashable | None = None) -> str | ChunkList:
        """Store a read-only tensor span once, by content: the digest of its blob, or, `pieced` and
        from CHUNK_BYTES up to PIECED_READ_ONLY_BYTES, its chunk list (its pieces shared with any
        tensor holding the same bytes; a pack and the list's blob where a blob is one file, the
        list the edits of `lineage`'s last one where put_pieces can)."""
        if pieced and CHUNK_BYTES <= span.numel() * span.element_size() < PIECED_READ_ONLY_BYTES:
            return self.put_chunks(span, lineage)[0]
        return self.put_blob(span)

    def _put_hashed_while_written(self, parts: Sequence[Any]) -> str:
        """A large blob: its bytes go to a temporary name while another thread hashes them (both
        let go of the interpreter lock, so it takes the slower of the two, not both), then take
        their name, unless a blob of that name is stored already."""
        staging = self.path / BLOBS_DIR / f".{threading.get_ident()}-{id(parts)}.blob"

        def name(target: Path) -> None:
            os.replace(staging, target)
            self._track(target)
        try:
            return self._put(_hashed_while(lambda: write_atomic(staging, parts, sync=self._sync), parts), name)
        finally:
            staging.unlink(missing_ok=True)  # still there when the blob was stored already

    def _put(self, digest: str, store: Callable[[Path], None]) -> str:
        """Store blob `digest` unless it is stored already; `store(target)` writes it when it is not."""
        with self._lock:
            if digest in self._known_blobs:
                return digest
        target = self.path / blob_relpath(digest)
        if not target.exists():
            store(target)
        with self._lock:
            self._known_blobs.add(digest)
        return digest

    def put_source(self, text: str) -> str:
        """Store a kernel's source text (data, never run unless the user trusts it) once, by the
        sha256 of its UTF-8 bytes; return that digest."""
        data = text.encode()
        digest = hashlib.sha256(data).hexdigest()
        target = self.path / source_relpath(digest)
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            self._write(target, [data])
        return digest

    def put_chunks(self, span: torch.Tensor, lineage: Hashable | None = None) -> tuple[ChunkList, list[str]]:
        """Store a tensor span as CHUNK_BYTES pieces of its bytes, each named by its content: the
        pieces no call stored before go into one pack file (format 3), and the list of every
        piece's digest and pack (a [pieces, 36] uint8 blob) is stored as a blob; return how the
        call names the list, and the pieces' digests. A piece or a list another call already
        stored costs nothing, nor does hashing a piece of zeros; with a `lineage`, see put_pieces."""
        raw = host_bytes(span)
        return self.put_pieces(cut_bytes(raw), hashing.known_zeros(raw, CHUNK_BYTES), lineage)

    def put_pieces(self, pieces: Sequence[Any], known: Sequence[str | None] | hashing.Known | None = None,
                   lineage: Hashable | None = None) -> tuple[ChunkList, list[str]]:
        """put_chunks for a span already cut into pieces (uint8 arrays); a piece whose digest
        `known` gives (the same bytes were stored before) is not hashed again, and may be None: a
        store of it wrote those bytes already. Stores of one `lineage` (a tensor of an op) name
        their list as edits of the lineage's last whole list where few rows changed (format 6,
        chunk_lists.py)."""
        digests, table = self._packs.store(pieces, known)
        # a base a lineage and length: a buffer's mask and the buffer may share a lineage
        key = (lineage, len(digests)) if lineage is not None else None
        with self._lock:
            base = self._list_bases.get(key) if key is not None else None
        edits = None
        if base is not None:
            places = _places_off_base(known, base[0])
            edits = (chunk_lists.edits_at(base[1], table, places) if places is not None
                     else chunk_lists.edits_between(base[1], table))
        if base is not None and edits is not None:
            return ChunkList(base[0], edits if len(edits) else None, rows=table), digests
        whole = self.put_blob(torch.from_numpy(table))
        if key is not None:  # a base once its blob is whole: a call naming it may be indexed before this one
            with self._lock:
                self._list_bases[key] = (whole, table)
        return ChunkList(whole, rows=table), digests

    def _write(self, target: Path, data: Sequence[Any]) -> None:
        write_atomic(target, data, sync=self._sync)
        self._track(target)

    def _track(self, target: Path) -> None:
        """A file just written under its name: flushed to disk at close, with durability "close"."""
        if not self._sync:
            with self._lock:
                self._unsynced.append(target)

    def write_call(self, index: int, header: dict[str, Any], spans: dict[str, torch.Tensor],
                   geometries: dict[str, Geometry], blobs: dict[str, str],
                   chunks: dict[str, ChunkList] | None = None) -> Path:
        """Write call `index` as a segment of its own and index it; the segment's path."""
        (line,) = self.write_segment([self.call_part(index, header, spans, geometries, blobs, chunks)])
        self.add_to_index(line)
        return self.path / line["file"]

    def write_tensors(self, index: int, header: dict[str, Any], tensors: dict[str, torch.Tensor],
                      blob_keys: Iterable[str] = (), chunk_keys: Iterable[str] = ()) -> Path:
        """Write and index call `index` holding `tensors` ('<role>/<name>' -> tensor, on any device):
        each inline, or as a blob when its key is in `blob_keys`, or in chunks when in `chunk_keys`.
        For writers with the tensors at hand; a recording goes through its pipeline's host copies."""
        blob_keys, chunk_keys = set(blob_keys), set(chunk_keys)
        geometries = {key: geometry_of(t) for key, t in tensors.items()}
        spans = {key: storage_span(t, geometries[key]).cpu() for key, t in tensors.items()}
        blobs = {key: self.put_blob(spans.pop(key)) for key in list(spans) if key in blob_keys}
        chunks = {key: self.put_chunks(spans.pop(key))[0] for key in list(spans) if key in chunk_keys}
        return self.write_call(index, header, spans, geometries, blobs, chunks)

    @staticmethod
    def call_part(index: int, header: dict[str, Any], spans: dict[str, torch.Tensor],
                  geometries: dict[str, Geometry], blobs: dict[str, str],
                  chunks: dict[str, ChunkList] | None = None,
                  befores: dict[str, dict[str, str]] | None = None) -> CallPart:
        """Call `index` made ready for a segment: `spans` holds the tensors stored in the segment;
        `blobs` maps keys to blob digests, `chunks` to their chunk lists (put_chunks),
        and `befores` an output buffer's key before the call to what it is made from (its key
        after, and its mask of unchanged elements: replay/snapshot/unwritten.py)."""
        chunks, befores = chunks or {}, befores or {}
        edited = {key: torch.from_numpy(listed.edits) for key, listed in chunks.items() if listed.edits is not None}
        if edited:  # each edit list a tensor of the call, after the tensor it edits
            spans = dict(spans, **{chunk_lists.edits_key(key): table for key, table in edited.items()})
            geometries = dict(geometries, **{chunk_lists.edits_key(key): geometry_of(table)
                                             for key, table in edited.items()})
        header = dict(header, index=index, tensors={
            key: dict(g.to_json(), **({"blob": blobs[key]} if key in blobs else {}),
                      **(chunks[key].to_json(key) if key in chunks else {}),
                      **({"before": befores[key]} if key in befores else {}))
            for key, g in geometries.items()
        })
        return CallPart(index, header["op"], header["variant"], json.dumps(header, allow_nan=False), spans,
                        sorted({*blobs.values(), *(listed.whole for listed in chunks.values())}))

    def write_segment(self, parts: Sequence[CallPart]) -> list[dict[str, Any]]:
        """Write one segment holding `parts` and return their index lines, for add_to_index: a call
        is part of the snapshot once indexed, and its segment is whole on disk before that."""
        metadata: dict[str, str] = {}
        spans: dict[str, torch.Tensor] = {}
        for part in parts:
            prefix = callfile.call_prefix(part.index)
            metadata[prefix + callfile.META_KEY] = part.description
            spans.update((prefix + key, span) for key, span in part.spans.items())
        with self._lock:
            number, self._segments = self._segments, self._segments + 1
        rel = segment_relpath(number)
        file_parts = callfile.serialize_parts(metadata, spans)
        size = sum(memoryview(part).nbytes for part in file_parts)
        if size >= SEGMENT_HASH_WHILE_WRITING_BYTES:
            sha256 = _hashed_while(lambda: self._write(self.path / rel, file_parts), file_parts)
        else:
            self._write(self.path / rel, file_parts)
            sha256 = sha256_parts(*file_parts)
        return [{"index": part.index, "op": part.op, "variant": part.variant, "file": rel,
                 "call": callfile.call_prefix(part.index), "sha256": sha256, "bytes": size, "blobs": part.blobs}
                for part in parts]

    def add_to_index(self, line: dict[str, Any]) -> None:
        """Append a written call's line to the index, on a file kept open: whole, or not at all.

        A write the kernel cuts short (a disk with a page left) is carried on where it stopped;
        if the rest cannot be written, the index is cut back to its last whole line and the
        OSError raised, so that no later line is ever glued to a partial one."""
        data = json.dumps(line).encode() + b"\n"
        with self._lock:
            if self._index_fd is None:
                self._index_fd = os.open(self.path / INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                self._index_size = os.fstat(self._index_fd).st_size
            try:
                _write_all(self._index_fd, data)
            except BaseException:  # a full disk, or an interrupt between two parts of the line
                with contextlib.suppress(OSError):  # a cut line left behind is what a reader reports
                    os.ftruncate(self._index_fd, self._index_size)
                raise
            self._index_size += len(data)
            if self._sync:
                os.fsync(self._index_fd)

    def close(self) -> None:
        """Write the manifest again if it missed an error or its git state, flush what durability
        "close" left in the page cache to disk (index last), and close the index."""
        self._git_reader.join()
        with self._lock:
            pending, self._unsynced = self._unsynced, []
            fd, self._index_fd = self._index_fd, None
            stale = self._manifest_stale
        try:
            if stale:
                try:
                    self._rewrite_manifest()
                except OSError as exc:
                    self.unsaved_errors = exc
            with self._lock:
                if self._manifest_unsynced:
                    pending.append(self.path / MANIFEST)
                    self._manifest_unsynced = False
            if pending:
                fsync_paths(pending + [self.path / INDEX])
        finally:
            if fd is not None:
                os.close(fd)

    def record_error(self, message: str) -> None:
        """Keep `message` in the manifest's capture_errors. Where the manifest cannot be written (a
        full disk), it is tried again at close(), and the OSError raised for the caller to say it."""
        with self._lock:
            self.manifest["capture_errors"].append(schema.as_text(message))
            self._manifest_stale = True
        self._rewrite_manifest()

    def set_manifest_field(self, key: str, value: Any) -> None:
        """Keep `value` as the manifest's `key` (a recording learns some of what produced it late: a
        rank's process group exists only once the program made it); written now, or at close()
        where the disk refuses it now."""
        with self._lock:
            self.manifest[key] = value
            self._manifest_stale = True
        with contextlib.suppress(OSError):
            self._rewrite_manifest()

    def _rewrite_manifest(self) -> None:
        with self._lock:
            self._write_manifest()
            self._manifest_stale = False


def host_bytes(span: torch.Tensor) -> Any:
    """A host span's bytes, as a numpy uint8 array over its memory."""
    return span.reshape(-1).view(torch.uint8).numpy()


def _places_off_base(known: Sequence[str | None] | hashing.Known | None, base: str) -> list[int] | None:
    """Where a store's list can differ from the base list `base` names: the store before's edits of
    that base and the fresh places, where `known` says both (None: anywhere)."""
    if not isinstance(known, hashing.Known) or known.fresh is None or known.listed is None \
            or known.listed.whole != base:
        return None
    edits = known.listed.edits
    before = chunk_lists.edited_places(edits).tolist() if edits is not None else []
    return sorted({*before, *known.fresh})


def cut_bytes(raw: Any) -> list[Any]:
    """Bytes (a numpy uint8 array) as CHUNK_BYTES pieces: views, the last one maybe short."""
    return [raw[start:start + CHUNK_BYTES] for start in range(0, len(raw), CHUNK_BYTES)]
