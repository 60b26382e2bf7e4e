"""Encoding of non-tensor call arguments as portable JSON.

Plain JSON has no inf/nan and no tuples, so these are wrapped in single-key objects
whose key starts with '$' (documented in docs/FORMAT.md). Dict keys must be strings
that do not start with '$'.
"""
from __future__ import annotations

import math
from typing import Any

_FLOAT_NAMES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
# JSON integers have no size limit, but parsers do (Python's: 4300 digits); 1024 bits is ample
MAX_INT_BITS = 1024
# a call description may nest 64 levels (replay/snapshot/schema.py); an argument sits 4 down and
# a wrapper takes two levels a step
MAX_DEPTH = 28


class NotJSONRepresentable(TypeError):
    """Raised with a short description of the offending (sub)value."""


def encode(value: Any, depth: int = 0) -> Any:
    """Turn an argument into a JSON-ready value, or raise NotJSONRepresentable."""
    if depth > MAX_DEPTH:
        raise NotJSONRepresentable(f"value nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise NotJSONRepresentable(f"integer of {value.bit_length()} bits (at most {MAX_INT_BITS})")
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or key.startswith("$"):
                raise NotJSONRepresentable(f"dict key {key!r} (keys must be strings not starting with '$')")
            out[key] = encode(item, depth + 1)
        return out
    raise NotJSONRepresentable(f"value of type {type(value).__name__}")


def decode(value: Any) -> Any:
    """Inverse of `encode`; ValueError for a malformed wrapper or a `$` key outside one."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        wrappers = [key for key in value if key.startswith("$")]
        if not wrappers:
            return {k: decode(v) for k, v in value.items()}
        if len(value) != 1:
            raise ValueError(f"{wrappers[0]!r} must be the only key of its object")
        (key, inner), = value.items()
        if key == "$float" and isinstance(inner, str) and inner in _FLOAT_NAMES:
            return _FLOAT_NAMES[inner]
        if key == "$tuple" and isinstance(inner, list):
            return tuple(decode(v) for v in inner)
        raise ValueError(f"malformed wrapper {{{key!r}: {type(inner).__name__}}} "
                         "(known: $float of 'nan', 'inf', '-inf'; $tuple of a list)")
    return value
