"""Sanitising names that become parts of file paths (op names, tags)."""
from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=-]")


def safe_component(name: str, *, max_len: int = 80) -> str:
    """Return `name` as a single safe path component.

    Separators, control characters and anything outside a small portable set become
    '_'; runs of dots are collapsed so '..' can never appear; the empty result is '_'.
    """
    cleaned = _UNSAFE.sub("_", str(name))
    cleaned = re.sub(r"\.{2,}", ".", cleaned).strip(".")
    return (cleaned or "_")[:max_len]
