"""Which snapshot locations are URLs, and the fsspec file system that reaches one (fsspec imported
only here, and only once a URL is met: it is an optional extra)."""
from __future__ import annotations

import re
from typing import Any

from replay.errors import ReplayError
from replay.snapshot.confined import one_line

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
INSTALL_HINT = "pip install kernel-replay[fsspec]"


def is_url(text: str) -> bool:
    """`scheme://...` for a protocol fsspec knows (s3, gs, memory, file, ...); plain paths are local.
    Without fsspec installed any `scheme://` counts, so that opening it says what to install rather
    than that no such directory exists."""
    match = _SCHEME.match(text)
    if match is None:
        return False
    try:
        import fsspec  # type: ignore[import-untyped]  # no stubs nor py.typed marker
    except ImportError:
        return True
    return match.group(1).lower() in fsspec.available_protocols()


def open_url(url: str) -> tuple[Any, str]:
    """The file system of `url` and the path inside it, without a trailing slash."""
    try:
        from fsspec.core import url_to_fs  # type: ignore[import-untyped]
    except ImportError:
        raise ReplayError(f"{url}: reading and writing snapshots at URLs needs fsspec: {INSTALL_HINT}") from None
    try:
        fs, path = url_to_fs(url)
    except ImportError as exc:  # the protocol's own package (s3fs, gcsfs) is missing
        raise ReplayError(f"{url}: {one_line(exc)}") from None
    except (ValueError, OSError) as exc:
        raise ReplayError(f"{url}: cannot open: {one_line(exc)}") from None
    return fs, path.rstrip("/")


def join(root: str, rel: str) -> str:
    """The remote path of `rel` (a '/'-separated path inside the snapshot) under `root`."""
    return f"{root}/{rel}" if root else rel
