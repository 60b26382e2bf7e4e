"""Atomic and exclusive file writes, content hashes, and names made safe to become paths."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import threading
import uuid
from pathlib import Path
from typing import Any, Sequence


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_parts(*parts: Any) -> str:
    """sha256 of the parts joined, without joining them (each a bytes-like buffer)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes | Sequence[Any], *, sync: bool = True) -> None:
    """Write `data` (bytes, or buffers written one after another) to a temporary name beside
    `path`, flush to disk (unless not `sync`: a killed process loses nothing the kernel's page
    cache holds, only a lost machine does; the disk write is then started, not waited for), then
    rename over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            parts: Sequence[Any] = [data] if isinstance(data, bytes) else data
            f.writelines(parts)
            f.flush()
            if sync:
                os.fsync(f.fileno())
            elif hasattr(os, "posix_fadvise"):
                # start writing it to disk now, without waiting: the flush at close then finds the
                # work done instead of doing all of it after the last file (Linux starts writeback
                # of dirty pages on DONTNEED; pages under writeback stay cached)
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        os.replace(tmp, path)
    except BaseException:
        # A failed write (disk full) must not leave a half-written temporary behind.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# errno values of a file system that has no hard links (FAT, some network and FUSE file systems)
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}


def create_exclusive(path: Path, data: bytes) -> bool:
    """Write `path` complete unless it exists; False if it did. Of two writers, one wins.

    The data goes to a temporary name, which is then hard-linked to `path`: unlike a
    rename, a link never replaces a file, and `path` is never seen half-written. Without
    hard links, `path` is created with O_EXCL and then written.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.new")
    write_atomic(tmp, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        return _create_with_o_excl(path, data)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return True


def _create_with_o_excl(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True


def fsync_paths(paths: list[Path]) -> None:
    """Flush files, then the directories holding them (their names), to disk; a file that is not
    there (an index no call reached) is skipped."""
    for path in [*paths, *dict.fromkeys(p.parent for p in paths)]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=-]")


def safe_component(name: str, *, max_len: int = 80) -> str:
    """Return `name` as a single safe path component.

    Separators, control characters and anything outside a small portable set become
    '_'; runs of dots are collapsed so '..' can never appear; the empty result is '_'.
    """
    cleaned = _UNSAFE.sub("_", str(name))
    cleaned = re.sub(r"\.{2,}", ".", cleaned).strip(".")
    return (cleaned or "_")[:max_len]
