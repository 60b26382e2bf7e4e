"""Signals during a bisect: SIGTERM unwinds like Ctrl-C, and cleanup cannot be cut short.

Inside `interruptible()` the first SIGINT or SIGTERM raises KeyboardInterrupt, so
`finally` blocks clean up; every signal after it waits until the block ends, so a
second or third Ctrl-C cannot cut that cleanup short, not even in the moment before
a `finally` starts. `deferred()` holds signals over a step that must not be cut in
two (adding or removing a worktree) and raises once it is done. Signals reach
Python's main thread only: elsewhere both are no-ops, and nothing there is ever
interrupted.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Iterator

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Guard:
    def __init__(self) -> None:
        self.active = False
        self.holding = 0  # deferred() blocks open
        self.pending = False  # a signal came while holding
        self.raised = False  # KeyboardInterrupt was raised once: the run is unwinding
        self.previous: dict[int, Any] = {}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.active:  # installed but a moment, or left by a restore a signal cut short
            _as_before(self.previous.get(signum), signum, frame)
        elif self.holding or self.raised:
            self.pending = True
        else:
            self.raised = True
            raise KeyboardInterrupt


_guard: _Guard | None = None  # the one interruptible() block open, if any


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers live there only


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise KeyboardInterrupt once, and are held after that."""
    global _guard
    if not _on_main_thread() or _guard is not None:
        yield
        return
    guard = _Guard()
    try:
        for sig in _SIGNALS:
            guard.previous[sig] = signal.signal(sig, guard.handle)
        guard.active, _guard = True, guard
        yield
    finally:
        guard.active, _guard = False, None  # from here a signal is handled as it was before the block
        try:
            _restore(guard.previous, signal.SIGTERM)
        finally:
            _restore(guard.previous, signal.SIGINT)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then raise KeyboardInterrupt if one came
    (unless one was raised before: then the run is unwinding already)."""
    if not _on_main_thread():
        yield
        return
    with interruptible():
        guard = _guard
        assert guard is not None
        guard.holding += 1
        try:
            yield
        finally:
            guard.holding -= 1
        if not guard.holding and guard.pending and not guard.raised:
            guard.raised = True
            raise KeyboardInterrupt


def _restore(previous: dict[int, Any], sig: int) -> None:
    if sig in previous:
        handler = previous[sig]
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _as_before(handler: Any, signum: int, frame: FrameType | None) -> None:
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # SIG_DFL, or None (not set from Python): its default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
