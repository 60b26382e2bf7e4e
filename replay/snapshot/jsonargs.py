"""Encoding of non-tensor call arguments as portable JSON.

Plain JSON has no inf/nan and no tuples, so these are wrapped in single-key objects
whose key starts with '$' (documented in docs/FORMAT.md). Dict keys must be strings
that do not start with '$'.
"""
from __future__ import annotations

import math
from typing import Any

_FLOAT_NAMES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class NotJSONRepresentable(TypeError):
    """Raised with a short description of the offending (sub)value."""


def encode(value: Any) -> Any:
    """Turn an argument into a JSON-ready value, or raise NotJSONRepresentable."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or key.startswith("$"):
                raise NotJSONRepresentable(f"dict key {key!r} (keys must be strings not starting with '$')")
            out[key] = encode(item)
        return out
    raise NotJSONRepresentable(f"value of type {type(value).__name__}")


def decode(value: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (key, inner), = value.items()
            if key == "$float":
                return _FLOAT_NAMES[inner]
            if key == "$tuple":
                return tuple(decode(v) for v in inner)
        return {k: decode(v) for k, v in value.items()}
    return value
