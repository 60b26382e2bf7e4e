"""Helpers shared by commands: turning ReplayErrors into one stderr line and an exit code."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from replay.errors import ReplayError


def exits_on_replay_error(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report a ReplayError as one line on stderr and exit with its code."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ReplayError as exc:
            print(f"replay: error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
    return wrapper
