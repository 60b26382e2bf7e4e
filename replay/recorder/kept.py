"""Buffers kept for reuse once let go, by key, within a bound on their bytes.

A program's steps take the sizes the step before let go, so a buffer let go is taken again by the
next store of its key. Past the bound, the buffers let go longest ago are dropped, never the one
let go now: a recording's first step (every store new, a gigabyte) must not fill the bound with
sizes no later step takes, leaving each later step's buffers unkept, a fresh allocation a store.
The caller holds its own lock around each method.
"""
from __future__ import annotations

import collections
from typing import Generic, Hashable, TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)


class Kept(Generic[Key]):
    """Buffers by key, at most `max_bytes` of them (the newest kept)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._free: dict[Key, list[torch.Tensor]] = {}  # each key's in the order let go
        self._age: collections.OrderedDict[int, tuple[Key, int]] = collections.OrderedDict()  # by id, oldest first

    def take(self, key: Key) -> torch.Tensor | None:
        """The buffer of `key` let go last, or None."""
        free = self._free.get(key)
        if not free:
            return None
        buffer = free.pop()
        self.nbytes -= self._age.pop(id(buffer))[1]
        return buffer

    def give(self, key: Key, buffer: torch.Tensor, nbytes: int) -> None:
        """Keep `buffer` (`nbytes`) for `key`, dropping the ones let go longest ago past the bound;
        one larger than the bound is dropped itself (a bound of 0 keeps none)."""
        if nbytes > self.max_bytes or not self.max_bytes:
            return
        self._free.setdefault(key, []).append(buffer)
        self._age[id(buffer)] = (key, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            _, (oldest, size) = self._age.popitem(last=False)
            self._free[oldest].pop(0)  # a key's oldest leads its list
            self.nbytes -= size

    def clear(self) -> None:
        """Drop every buffer kept."""
        self._free, self._age, self.nbytes = {}, collections.OrderedDict(), 0
