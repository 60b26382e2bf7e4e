"""A finished local snapshot (or multi-rank parent) put at a URL in the order a writer lands its
files: content first, each complete or not at all, then each index, each manifest last, so that
a reader never finds an index naming a file not there yet, nor a manifest before its calls."""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

from replay.errors import ReplayError, SnapshotError
from replay.ranks.layout import is_multi_rank
from replay.snapshot.confined import one_line
from replay.snapshot.reader import rank_snapshots
from replay.snapshot.writer import MANIFEST
from replay.storage.fetch import Progress
from replay.storage.listing import landing_order
from replay.storage.urls import join, open_url

# object stores, where a put lands whole or not at all; elsewhere a file is put under a temporary
# name beside its own, then moved (a rename, where the store has them)
ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def upload_snapshot(local: Path, url: str, progress: Progress | None = None) -> None:
    """Put the snapshot at `local` at `url`, which must hold none yet."""
    files = _snapshot_files(Path(local))
    fs, root = open_url(url)
    _ensure_vacant(fs, root, url)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    atomic = bool(ATOMIC_PUT.intersection(protocols))
    for done, rel in enumerate(sorted(files, key=landing_order), start=1):
        try:
            _put(fs, str(Path(local) / rel), join(root, rel), atomic)
        except OSError as exc:
            raise ReplayError(f"{url}/{rel}: upload failed: {one_line(exc)}") from None
        if progress:
            progress(done, len(files), rel)


def ensure_vacant(url: str) -> None:
    """A SnapshotError if `url` already holds a snapshot (or ranks of one): checked before a
    recording starts, so that its upload is not refused at the end."""
    fs, root = open_url(url)
    _ensure_vacant(fs, root, url)


def _ensure_vacant(fs: Any, root: str, url: str) -> None:
    try:
        taken = fs.exists(join(root, MANIFEST)) or bool(fs.glob(join(root, f"rank-*/{MANIFEST}")))
    except OSError as exc:
        raise ReplayError(f"{url}: cannot look: {one_line(exc)}") from None
    if taken:
        raise SnapshotError(f"{url}: already holds a snapshot; upload to a new URL")


def _snapshot_files(local: Path) -> list[str]:
    """The files of the snapshot (every rank's, of a multi-rank parent), '/'-separated, temporaries
    left out; a link is refused (what it leads to is not the snapshot's)."""
    if not (local / MANIFEST).is_file() and not is_multi_rank(local):
        raise SnapshotError(f"{local}: not a snapshot (no {MANIFEST}) nor a multi-rank recording")
    snapshots = [local] if (local / MANIFEST).is_file() else list(rank_snapshots(local).values())
    files = []
    for snapshot in snapshots:
        for folder, dirs, names in os.walk(snapshot):
            for name in [*names, *dirs]:
                path = Path(folder) / name
                if path.is_symlink():
                    raise SnapshotError(f"{path}: a link; a snapshot to upload holds regular files only")
            files += [(Path(folder) / name).relative_to(local).as_posix() for name in names if not name.startswith(".")]
    return files


def _put(fs: Any, source: str, target: str, atomic: bool) -> None:
    if atomic:
        fs.put_file(source, target)
        return
    parent, _, name = target.rpartition("/")
    tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.part"
    fs.makedirs(parent, exist_ok=True)
    try:
        fs.put_file(source, tmp)
        fs.mv(tmp, target)
    except BaseException:
        with contextlib.suppress(Exception):  # the store may be what failed: the error to report is the put's
            fs.rm(tmp)
        raise
