"""Delta debugging (Zeller and Hildebrandt's ddmin) for the smallest set with a property.

`ddmin(items, holds)` returns a subset of `items` for which `holds` is true and from which no
single item can be dropped with it still true (1-minimal), given that it holds for all of
`items`. It tries halves, then complements, then finer splits, so one item alone responsible is
found in about 2 log2(n) tests, and sets of any shape (not only prefixes or suffixes) are
reached. `holds` is asked each distinct set once.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def ddmin(items: Sequence[T], holds: Callable[[tuple[T, ...]], bool]) -> list[T]:
    asked: dict[tuple[T, ...], bool] = {}

    def test(subset: list[T]) -> bool:
        key = tuple(subset)
        if key not in asked:
            asked[key] = holds(key)
        return asked[key]

    current, parts = list(items), 2
    while len(current) >= 2:
        chunks = _split(current, parts)
        found = next((c for c in chunks if test(c)), None)
        if found is not None:
            current, parts = found, 2
            continue
        rest = next((r for r in ([x for x in current if x not in c] for c in chunks) if test(r)), None) \
            if parts > 2 else None
        if rest is not None:
            current, parts = rest, max(parts - 1, 2)
            continue
        if parts >= len(current):
            break
        parts = min(len(current), parts * 2)
    return current


def _split(items: list[T], parts: int) -> list[list[T]]:
    """`items` in `parts` runs as equal as they come, in order."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        runs.append(items[start:end])
        start = end
    return [r for r in runs if r]
