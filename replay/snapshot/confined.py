"""A snapshot directory's files, read so that nothing outside it is: the reader's way to the disk.

A path the index names is read only if it is a regular file whose real path lies inside the
directory, at most a given size, and not mostly holes: never a link out, a device or a FIFO.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator

from replay.errors import SnapshotError
from replay.snapshot.files import sha256_bytes

MAX_FILE_BYTES = 1 << 40
# a file whose size is mostly holes would cost memory its disk blocks do not: refused past this size
SPARSE_SLACK = 1 << 20


def one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line (errors are reported as one line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class ConfinedDir:
    """Reads the files of directory `path`; `lister` is the file that names them (errors say it
    refused a path outside), `verify` whether content hashes are checked."""

    def __init__(self, path: Path, lister: Path, verify: bool):
        self.path, self.lister, self.verify = path, lister, verify
        try:
            if not path.is_dir():
                what = "a file, not a snapshot directory" if path.exists() else "no such snapshot directory"
                raise SnapshotError(f"{path}: {what}")
            self._root = os.path.realpath(path)
        except (OSError, ValueError) as exc:  # a NUL byte or an unreachable path
            raise SnapshotError(f"{path}: not a readable directory: {one_line(exc)}") from None

    @contextlib.contextmanager
    def opened(self, rel: str, missing: str) -> Iterator[tuple[int, int]]:
        """`rel` opened for reading, with its size."""
        path = self.path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise SnapshotError(f"{self.lister}: refuses path {rel!r} outside the snapshot")
        real = os.path.realpath(path)
        if not real.startswith(self._root + os.sep):
            raise SnapshotError(f"{path}: leads outside the snapshot (to {real}); refused")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise SnapshotError(f"{path}: {missing}") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: unreadable: {one_line(exc)}") from None
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

    def read(self, rel: str, *, limit: int, exact: bool = False,
             missing: str = "missing file listed in the index") -> bytes:
        """The bytes of `rel`, at most `limit` (exactly `limit` when `exact` and verifying)."""
        path = self.path / rel
        with self.opened(rel, missing) as (fd, size):
            if size > limit or (exact and self.verify and size != limit):
                raise SnapshotError(f"{path}: {size} bytes, "
                                    + (f"the index says {limit} (truncated or corrupt file)" if exact
                                       else f"more than the {limit} this file may hold"))
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(size)  # what fstat saw, even if the file grows meanwhile

    def read_verified(self, rel: str, expected_sha: str, expected_bytes: int | None = None) -> bytes:
        """The bytes of `rel`, checked against the sha256 (and size) that names or lists it."""
        if expected_bytes is None:
            data = self.read(rel, limit=MAX_FILE_BYTES)
        else:
            data = self.read(rel, limit=expected_bytes, exact=True)
        if self.verify and sha256_bytes(data) != expected_sha:
            raise SnapshotError(f"{self.path / rel}: sha256 mismatch (corrupt or truncated file)")
        return data
