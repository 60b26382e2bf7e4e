"""Byte ranges painted with values: the last writer of every byte of a device's memory, say.

Pieces are disjoint and kept sorted by start; assigning a range cuts the pieces it overlaps.
A recording's calls touch each range a few times, so lists and bisection are enough.
"""
from __future__ import annotations

import bisect
from typing import Callable, Generic, TypeVar

V = TypeVar("V")


class IntervalMap(Generic[V]):
    """Disjoint half-open byte ranges [start, end), each holding a value."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._pieces: list[tuple[int, int, V]] = []

    def _first_overlapping(self, start: int) -> int:
        i = bisect.bisect_right(self._starts, start) - 1
        return i if i >= 0 and self._pieces[i][1] > start else i + 1

    def pieces(self, start: int, end: int) -> list[tuple[int, int, V]]:
        """The painted pieces overlapping [start, end), cut to it, in address order."""
        found: list[tuple[int, int, V]] = []
        if start >= end:
            return found
        i = self._first_overlapping(start)
        while i < len(self._pieces) and self._pieces[i][0] < end:
            s, e, value = self._pieces[i]
            found.append((max(s, start), min(e, end), value))
            i += 1
        return found

    def assign(self, start: int, end: int, value: V) -> None:
        """Paint [start, end) with `value`, over whatever was there."""
        if start >= end:
            return
        first = i = self._first_overlapping(start)
        kept: list[tuple[int, int, V]] = []
        while i < len(self._pieces) and self._pieces[i][0] < end:
            s, e, old = self._pieces[i]
            if s < start:
                kept.append((s, start, old))
            if e > end:
                kept.append((end, e, old))
            i += 1
        new = sorted([*kept, (start, end, value)], key=lambda p: p[0])
        self._pieces[first:i] = new
        self._starts[first:i] = [p[0] for p in new]

    def update(self, start: int, end: int, change: Callable[[V | None], V]) -> None:
        """Paint every part of [start, end) with `change` of what it held (None where unpainted)."""
        parts: list[tuple[int, int, V | None]] = []
        at = start
        for s, e, value in self.pieces(start, end):
            if at < s:
                parts.append((at, s, None))
            parts.append((s, e, value))
            at = e
        if at < end:
            parts.append((at, end, None))
        for s, e, held in parts:
            self.assign(s, e, change(held))
