"""What of a remote snapshot the reader could read: the files under the URL's prefix, listed once
with their sizes and change stamps, refused whole where one is a link or names a way out; and of
those, the ones the reader opens (the manifest, the index, what the index names, blobs/, packs/,
sources/), each with its sha256 where that is known before it is fetched."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from replay.errors import ReplayError, SnapshotError
from replay.snapshot.confined import MAX_FILE_BYTES, one_line
from replay.snapshot.piece_packs import PACKS_DIR
from replay.snapshot.reader import MAX_INDEX_BYTES, MAX_MANIFEST_BYTES, MAX_SOURCE_BYTES
from replay.snapshot.writer import BLOBS_DIR, INDEX, MANIFEST, RANK_DIR, SOURCES_DIR

MAX_REMOTE_FILES = 1 << 20  # more than any recording writes: a listing past it is not a snapshot
# what a store's `info` says that changes whenever an object's content does (size aside)
STAMP_KEYS = ("ETag", "etag", "md5", "md5Hash", "crc32c", "checksum", "generation", "VersionId", "version_id",
              "LastModified", "last_modified", "mtime", "updated", "created")
# the folders the reader opens files of by name, and the name that says a file's sha256 (a pack's
# name is a number: its content is known only once fetched)
_READ_FOLDERS: dict[str, re.Pattern[str] | None] = {BLOBS_DIR: re.compile(r"([0-9a-f]{64})\.safetensors"),
                                                   SOURCES_DIR: re.compile(r"([0-9a-f]{64})\.py"), PACKS_DIR: None}
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RemoteFile:
    rel: str  # '/'-separated, inside the URL's prefix
    size: int
    stamp: dict[str, str]  # empty where the store says nothing that changes with the content


def list_remote(fs: Any, root: str, url: str) -> dict[str, RemoteFile]:
    """Every file under `root`, by its path inside it; a link, a path with '..', or more than
    MAX_REMOTE_FILES files is a SnapshotError naming `url` and the file."""
    try:
        found = fs.find(root, withdirs=True, detail=True)
    except FileNotFoundError:
        found = {}
    except OSError as exc:
        raise ReplayError(f"{url}: cannot list: {one_line(exc)}") from None
    if len(found) > MAX_REMOTE_FILES:
        raise SnapshotError(f"{url}: holds more than {MAX_REMOTE_FILES} files; not a snapshot, refused")
    files = {}
    for name, info in found.items():
        name = name.rstrip("/")
        if not name.startswith(root + "/"):
            continue  # the prefix itself, or a neighbour sharing its first letters
        rel = name[len(root) + 1:]
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise SnapshotError(f"{url}: holds {rel!r}, a path that leads outside the snapshot; refused")
        if info.get("islink"):
            raise SnapshotError(f"{url}/{rel}: a link; a snapshot holds regular files only, refused")
        if info.get("type") == "directory":
            continue
        if info.get("type") != "file":
            raise SnapshotError(f"{url}/{rel}: not a regular file ({info.get('type')}); refused")
        stamp = {key: str(info[key]) for key in STAMP_KEYS if info.get(key) is not None}
        files[rel] = RemoteFile(rel, int(info.get("size") or 0), stamp)
    return files


def snapshot_prefixes(files: dict[str, RemoteFile], url: str) -> list[str]:
    """'' for a snapshot, or 'rank-<r>/' for each rank of a multi-rank parent (no manifest of its own)."""
    if MANIFEST in files:
        return [""]
    ranks = sorted(rel.split("/")[0] + "/" for rel in files
                   if rel.count("/") == 1 and rel.endswith("/" + MANIFEST) and RANK_DIR.match(rel.split("/")[0]))
    if not ranks:
        raise SnapshotError(f"{url}: no {MANIFEST} (not a snapshot) and no rank-<r>/ snapshots in it")
    return ranks


def size_limit(rel: str) -> int:
    """The most bytes the reader takes of `rel`: fetching more is refused before it starts."""
    name = PurePosixPath(rel)
    if name.name == MANIFEST:
        return MAX_MANIFEST_BYTES
    if name.name == INDEX:
        return MAX_INDEX_BYTES
    if name.parent.name == SOURCES_DIR:
        return MAX_SOURCE_BYTES
    return MAX_FILE_BYTES


def readable_files(files: dict[str, RemoteFile], prefix: str, index: bytes, url: str) -> dict[str, str | None]:
    """The files of the snapshot at `prefix` the reader could open besides its manifest and index,
    with the sha256 each must have where known: those `index` names (absent ones are left for the
    reader to report), and every file in blobs/, packs/ and sources/."""
    wanted: dict[str, str | None] = {}
    for rel in files:
        folder, _, name = rel[len(prefix):].partition("/")
        if rel.startswith(prefix) and folder in _READ_FOLDERS and "/" not in name:
            pattern = _READ_FOLDERS[folder]
            match = pattern.fullmatch(name) if pattern else None
            wanted[rel] = match.group(1) if match else None
    for name, digest in _index_named(index):
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts:
            raise SnapshotError(f"{url}/{prefix}{INDEX}: names {name!r}, outside the snapshot; refused")
        rel = prefix + path.as_posix()
        if rel in files:
            wanted[rel] = digest
    return wanted


def _index_named(index: bytes) -> list[tuple[str, str | None]]:
    """(file, sha256) of each index line that names them; a damaged line is the reader's to report."""
    named = []
    for line in index.split(b"\n"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("file"), str) and entry["file"]:
            digest = entry.get("sha256")
            named.append((entry["file"], digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else None))
    return named


def landing_order(rel: str) -> tuple[bool, bool, str]:
    """The order a writer lands a snapshot's files in: content, then the index, the manifest last."""
    name = rel.rsplit("/", 1)[-1]
    return name == MANIFEST, name == INDEX, rel
