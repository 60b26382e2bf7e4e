"""A one-shot signal between threads: set once, waited for by any number.

threading.Event does this with a condition variable, two Python constructors and several locks
to make; a recording makes one for each tracked store and checksum launch on the program's
thread, where that cost counts. A Latch is one lock, held until it is set.
"""
from __future__ import annotations

import _thread


class Latch:
    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # released by set(): a waiter gets it then
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:  # two first set()s at once: the other released it
            pass

    def wait(self) -> None:
        """Return once set() has been called."""
        if self._set:
            return
        self._lock.acquire()
        try:  # and let the next waiter through
            self._lock.release()
        except RuntimeError:  # a racing set() released it for us: it is open either way
            pass
