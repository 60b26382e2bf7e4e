"""Atomic file writes, content hashes, and names made safe to become paths."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name beside `path`, flush to disk, then rename over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A failed write (disk full) must not leave a half-written temporary behind.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_line(path: Path, line: str) -> None:
    """Append one complete line with a single write, flushed to disk."""
    with open(path, "ab") as f:
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=-]")


def safe_component(name: str, *, max_len: int = 80) -> str:
    """Return `name` as a single safe path component.

    Separators, control characters and anything outside a small portable set become
    '_'; runs of dots are collapsed so '..' can never appear; the empty result is '_'.
    """
    cleaned = _UNSAFE.sub("_", str(name))
    cleaned = re.sub(r"\.{2,}", ".", cleaned).strip(".")
    return (cleaned or "_")[:max_len]
