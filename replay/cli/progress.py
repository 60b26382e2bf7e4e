"""Progress display for long work: a rich bar on a terminal, nothing otherwise."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from replay.cli.common import SafeConsole


@contextlib.contextmanager
def call_progress(quiet: bool = False, label: Callable[[Any], str] | None = None, doing: str = "replaying"
                  ) -> Iterator[Callable[[int, int | None, Any], None] | None]:
    """Yield a (done, total, item) callback that advances a bar on stderr, or None; the bar says
    `doing`, then `label(item)` (default: the call's index and op)."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True, console=SafeConsole(stderr=True)) as bar:
        task = bar.add_task(doing, total=None)

        def advance(done: int, total: int | None, item: Any) -> None:
            said = label(item) if label else f"call {getattr(item, 'index', '')} {getattr(item, 'op', '')}".strip()
            bar.update(task, completed=done, total=total, description=escape(said))  # an op name is no markup
        yield advance
