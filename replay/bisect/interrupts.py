"""Signals during a bisect: SIGTERM unwinds like Ctrl-C, and cleanup cannot be cut short."""
from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers live there only


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt, so `finally` blocks clean up."""
    if not _on_main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends (a second Ctrl-C during cleanup
    would leave worktrees behind), then raise KeyboardInterrupt if one came."""
    if not _on_main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if arrived:
        raise KeyboardInterrupt
