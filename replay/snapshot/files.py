"""Atomic file writes and content hashes."""
from __future__ import annotations

import contextlib
import hashlib
import os
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
