"""Device memory a recording stages pieces in, kept for reuse once let go.

A staged store takes a device buffer of its padded size at every call: through torch, an
allocation, which lets go of the interpreter lock and waits to take it back beside the writers
(docs/PERFORMANCE.md, "The mechanism, one operation at a time"). A program's steps store the same
tensors again and again, so buffers are kept by exact size once let go and taken again by the
next store of that size: a dictionary's list, no torch operator. Like torch's own allocator, a
buffer is reused only on the stream it was taken on: the work queued on it (the checksums'
launch writing the changed pieces) runs before any later use on that stream; the writers'
reads on their own stream are waited for before a buffer is let go. Buffers wait while they and
what `held()` counts (the recording's staged stores) stay within `max_bytes`: the recording's
device memory never passes its staging budget; the rest go back to torch, and all of them when
the recording ends (close()) or an allocation of the recorder's finds no room. Where the runtime is not called for a device (another device than the
current one), torch's allocator alone serves; the runtime's host twin (tests) is kept alike.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

import torch

from replay.recorder import cuda_runtime


class DeviceBuffers:
    """Buffers of `allocate(nbytes, device)` kept by (device, stream, size) once given back, while
    they and the bytes `held()` counts stay within `max_bytes` (kept buffers are live tensors,
    which torch cannot take back when the program itself runs out of memory). A bound of a step's
    worth or less is worse than none: a Liger block's step stages ~1.1 GiB in buffers of 16 MiB to
    250 MiB, and one of 512 MiB dropped and allocated ~15 a step again (docs/PERFORMANCE.md)."""

    def __init__(self, allocate: Callable[[int, torch.device], torch.Tensor], max_bytes: int,
                 held: Callable[[], int] = lambda: 0):
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
            free = self._free.get(key)
            if free:
                self._free_bytes -= nbytes
                buffer = free.pop()
                return buffer, functools.partial(self._give, key, buffer)
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

    def clear(self) -> None:
        """Give every kept buffer back to torch."""
        with self._lock:
            self._free, self._free_bytes = {}, 0

    def close(self) -> None:
        """The recording ended: every buffer goes back to torch, those given back later too."""
        with self._lock:
            self._closed = True
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
