"""Where a call's tensors lived: the bytes each one read or wrote, by device and address.

Kept in a call's `meta.memory` (docs/FORMAT.md), so that `replay graph` can link each call to
the call that last wrote the bytes it read, and `replay run --propagate` can hand a call the
outputs its producers made when replayed. An address is only a name for bytes while the
program ran: nothing is ever read through it.
"""
from __future__ import annotations

import functools
import itertools
import threading
import weakref

import torch

from replay.recorder.staging import Stage, Tensor


class StorageIds:
    """A number for the memory each recorded tensor lives in, the same for as long as the tensor it
    is a view of lives, never reused: bytes at one address in two allocations (memory freed and
    allocated again) are not one tensor's, and a reader of the second did not read what a writer of
    the first wrote. Keyed by the view's base tensor, held weakly (a weak reference to a storage
    crashed torch 2.11's garbage collector on the H100): a tensor sharing memory without being a
    view (`detach()`) counts as other memory, so it is never linked, never linked wrongly."""

    def __init__(self) -> None:
        self._ids: dict[int, tuple[weakref.ref, int]] = {}
        self._next = itertools.count(1)
        self._lock = threading.Lock()

    def of(self, t: torch.Tensor) -> int:
        base = t._base if t._base is not None else t
        with self._lock:
            known = self._ids.get(id(base))
            if known is not None and known[0]() is base:
                return known[1]
            number = next(self._next)
            self._ids[id(base)] = (weakref.ref(base, functools.partial(self._forget, id(base))), number)
            return number

    def _forget(self, key: int, dead: weakref.ref) -> None:
        # from the garbage collector, perhaps while this thread holds the lock: one dict operation
        if self._ids.get(key, (None,))[0] is dead:
            self._ids.pop(key, None)


class Footprint:
    """The byte ranges of a call's arguments and outputs, noted as the staging walk passes them."""

    __slots__ = ("ranges", "_storages")

    def __init__(self, storages: StorageIds) -> None:
        # key -> {"device", "start" byte, "end" byte, "storage" number, "version" (absent: inference mode)}
        self.ranges: dict[str, dict[str, str | int]] = {}
        self._storages = storages

    def noting(self, stage: Stage) -> Stage:
        """`stage`, noting each tensor's bytes first (tags are the call's own intermediates: left out).
        The version counter tells a later reader whether anything unrecorded wrote the tensor since."""
        def note(tensor: Tensor) -> None:
            if not tensor.key.startswith("tag/"):
                t = tensor.value
                start = t.data_ptr()
                where: dict[str, str | int] = {"device": str(t.device), "start": start,
                                               "end": start + tensor.geometry.span * t.element_size(),
                                               "storage": self._storages.of(t)}
                if not t.is_inference():
                    where["version"] = t._version
                self.ranges[tensor.key] = where
            stage(tensor)
        return note

    def cuda_device(self) -> str | None:
        """The first CUDA device the call's tensors are on (the device its kernels ran on)."""
        for where in self.ranges.values():
            device = where["device"]
            if isinstance(device, str) and device.startswith("cuda"):
                return device
        return None
