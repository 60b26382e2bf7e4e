"""Device memory a recording stages pieces in, kept for reuse once let go.

A staged store takes a device buffer of its padded size at every call: through torch, an
allocation, which lets go of the interpreter lock and waits to take it back beside the writers
(docs/PERFORMANCE.md, "The mechanism, one operation at a time"). A program's steps store the same
tensors again and again, so buffers are kept by exact size once let go and taken again by the
next store of that size: a dictionary's list, no torch operator. Like torch's own allocator, a
buffer is reused only on the stream it was taken on: the work queued on it (the checksums'
launch writing the changed pieces) runs before any later use on that stream; the writers'
reads on their own stream are waited for before a buffer is let go. Kept buffers, what `held()`
counts (the recording's staged stores) and a fresh buffer stay within `max_bytes` (the staging
budget: the recorder's staged and kept device memory share one bound, its scratch in use
besides): a buffer given back past it goes to torch, and a fresh one first lets kept ones go,
the sizes taken least lately first (sizes the program no longer makes). All go back to torch
when the recording ends (close()) or an allocation of the recorder's finds no room. Where the
runtime is not called for a device (another device than the current one), torch's allocator
alone serves; the runtime's host twin (tests) is kept alike.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

import torch

from replay.recorder import cuda_runtime


def _none_held() -> int:
    return 0


class DeviceBuffers:
    """Buffers of `allocate(nbytes, device)` kept by (device, stream, size) once given back, while
    they and the bytes `held()` counts stay within `max_bytes` (kept buffers are live tensors,
    which torch cannot take back when the program itself runs out of memory). A bound of a step's
    worth or less is worse than none: a Liger block's step stages ~1.1 GiB in buffers of 16 MiB to
    250 MiB, and one of 512 MiB let ~6 go and allocated ~15 a step (docs/PERFORMANCE.md)."""

    def __init__(self, allocate: Callable[[int, torch.device], torch.Tensor], max_bytes: int,
                 held: Callable[[], int] = _none_held):
        self._allocate, self.max_bytes, self._held = allocate, max_bytes, held
        self._free: dict[tuple[int | None, int, int], list[torch.Tensor]] = {}
        self._free_bytes = 0
        self._closed = False  # the recording ended: buffers its writers give back go to torch
        # re-entrant: a collection inside it may finalize a store whose buffer comes back here
        self._lock = threading.RLock()

    def take(self, nbytes: int, device: torch.device) -> tuple[torch.Tensor, Callable[[], None]]:
        """A buffer of `nbytes` on `device` (uint8, 1-D) for work on its current stream, and what
        gives it back once that work and every read of it are done (or queued on that stream)."""
        runtime = cuda_runtime.on_current_device(device)
        if runtime is None:  # a device the runtime is not called for here: torch's allocator alone
            return self._allocate(nbytes, device), nothing
        key = (device.index, runtime.current_stream(device.index), nbytes)
        with self._lock:
            free = self._free.pop(key, None)
            if free:
                self._free[key] = free  # a size in use moves to the end: the last to be let go (_trim)
                self._free_bytes -= nbytes
                buffer = free.pop()
                return buffer, functools.partial(self._give, key, buffer)
            # a fresh one: kept ones make room for it first, so that kept, held and new fit the bound
            dropped = self._trim(self.max_bytes - self._held() - nbytes)
        del dropped  # back to torch, outside the lock
        try:
            buffer = self._allocate(nbytes, device)
        except torch.cuda.OutOfMemoryError:  # the kept ones back to torch first, which may fit this one
            if not self._free_bytes:
                raise
            self.clear()
            buffer = self._allocate(nbytes, device)
        return buffer, functools.partial(self._give, key, buffer)

    def _give(self, key: tuple[int | None, int, int], buffer: torch.Tensor) -> None:
        with self._lock:
            if not self._closed and self._free_bytes + key[2] + self._held() <= self.max_bytes:  # else torch's
                # setdefault: a collection while the list is made may give back another buffer of this key
                self._free.setdefault(key, []).append(buffer)
                self._free_bytes += key[2]

    def _trim(self, room: int) -> list[torch.Tensor]:
        """Let kept buffers go, the sizes taken least lately first (sizes a program no longer
        makes), until the kept ones fit in `room`; those let go (called holding the lock)."""
        dropped: list[torch.Tensor] = []
        for key in list(self._free):
            if self._free_bytes <= room:
                break
            free = self._free.pop(key)
            while free and self._free_bytes > room:
                dropped.append(free.pop())
                self._free_bytes -= key[2]
            if free:
                self._free[key] = free
        return dropped

    def clear(self) -> None:
        """Give every kept buffer back to torch."""
        with self._lock:
            self._free, self._free_bytes = {}, 0

    def close(self) -> None:
        """The recording ended: every buffer goes back to torch, those given back later too."""
        with self._lock:
            self._closed = True
            self._held = _none_held  # and no cycle through the tracker that counts them
        self.clear()

    @property
    def free_bytes(self) -> int:
        return self._free_bytes


def nothing() -> None:
    """What gives back a buffer that is not kept: nothing."""


def _allocate(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


# for work outside a recording's own (which keeps its buffers for reuse): torch's allocator alone
UNKEPT = DeviceBuffers(_allocate, max_bytes=0)
