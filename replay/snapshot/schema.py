"""The JSON shapes of the format (format.schema.json beside this file), checked before use.

Everything JSON in a snapshot (manifest, index lines, call metadata) goes through `parse`:
no NaN or Infinity literals, at most MAX_DEPTH levels of nesting, strings that are text (a
JSON escape of a lone surrogate, "\\ud800", is no character: it could not be printed or made a
path), and the shape its schema definition gives, so that a hostile file is one SnapshotError naming it, never an
OverflowError, RecursionError or TypeError deep in the code that reads it. The validator
covers the subset of JSON Schema the file uses.
"""
from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

MAX_DEPTH = 64
SCHEMA_FILE = Path(__file__).with_name("format.schema.json")

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
                                       "null": (type(None),), "integer": (int,), "number": (int, float)}


class SchemaError(ValueError):
    """A JSON document that is not of the format's shape; the message says where and why."""


@lru_cache(maxsize=1)
def _definitions() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())["$defs"]


def _reject_constant(name: str) -> Any:
    raise SchemaError(f"{name} is not valid JSON (the format has no NaN or Infinity literals)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SchemaError(f"the number {text[:20]} overflows a float (the format has no infinities)")
    return value


def parse(text: str | bytes, definition: str) -> Any:
    """`text` as JSON, checked against the schema definition named `definition`."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise SchemaError(f"nested more than {MAX_DEPTH} levels deep") from None
    except SchemaError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"not JSON: {' '.join(str(exc).split())}") from None
    check_structure(value)
    validate(value, definition)
    return value


def check_structure(value: Any) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH, and strings (keys too) that are not text (walked
    without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key in item:
                _check_text(key)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        pending.extend((child, depth + 1) for child in children)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SchemaError(f"a string holds {text[exc.start]!a}, a lone surrogate: no character") from None


def as_text(text: str) -> str:
    """`text` with any lone surrogate written as its escape: free text (notes, error messages) as a
    snapshot may hold it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_name(name: str, what: str) -> None:
    """A ValueError unless `name` (an op's, a variant's, a tag's) is text a snapshot may hold."""
    try:
        _check_text(name)
    except SchemaError as exc:
        raise ValueError(f"{what} {name!a}: {exc}") from None


def validate(value: Any, definition: str) -> None:
    """Raise SchemaError where `value` does not have the shape of the named definition."""
    _check(value, {"$ref": f"#/$defs/{definition}"}, "")


def _check(value: Any, rule: dict[str, Any], where: str) -> None:
    if "$ref" in rule:
        rule = {**_definitions()[rule["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in rule.items() if k != "$ref"}}
    here = where or "the document"
    if "type" in rule:
        names = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        # bool is an int in Python, but not in JSON Schema
        if not any(isinstance(value, _TYPES[n]) and not (isinstance(value, bool) and n in ("integer", "number"))
                   for n in names):
            raise SchemaError(f"{here}: expected {' or '.join(names)}, got {_describe(value)}")
    if "enum" in rule and value not in rule["enum"]:
        raise SchemaError(f"{here}: {_describe(value)} is not one of {', '.join(map(str, rule['enum']))}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in rule and value < rule["minimum"]:
            raise SchemaError(f"{here}: {value} is below {rule['minimum']}")
        if "maximum" in rule and value > rule["maximum"]:
            raise SchemaError(f"{here}: {_describe(value)} is above {rule['maximum']}")
    if isinstance(value, str):
        if len(value) > rule.get("maxLength", len(value)):
            raise SchemaError(f"{here}: a string of {len(value)} characters, at most {rule['maxLength']} allowed")
        if "pattern" in rule and not _pattern(rule["pattern"]).search(value):
            raise SchemaError(f"{here}: {_describe(value)} is not a valid value here")
    if isinstance(value, list):
        if not rule.get("minItems", 0) <= len(value) <= rule.get("maxItems", len(value)):
            raise SchemaError(f"{here}: {len(value)} items, outside [{rule.get('minItems', 0)}, {rule['maxItems']}]")
        if "items" in rule:
            for n, item in enumerate(value):
                _check(item, rule["items"], f"{where}[{n}]")
    if isinstance(value, dict):
        missing = [key for key in rule.get("required", ()) if key not in value]
        if missing:
            raise SchemaError(f"{here}: missing field {missing[0]!r}")
        properties = rule.get("properties", {})
        for key, item in value.items():
            sub = properties.get(key, rule.get("additionalProperties", True))
            if sub is False:
                raise SchemaError(f"{here}: unexpected field {key!r}")
            if isinstance(sub, dict):
                _check(item, sub, f"{where}.{key}" if where else key)


@lru_cache(maxsize=None)
def _pattern(source: str) -> re.Pattern[str]:
    """A schema pattern with JSON Schema's meaning of `$` (the very end; Python's also matches before a
    final newline)."""
    return re.compile(re.sub(r"(?<!\\)\$$", r"\\Z", source))


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."
