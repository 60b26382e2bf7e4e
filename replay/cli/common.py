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


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json FILE|-`: write the report as JSON to FILE, or to stdout (and print nothing else)."""
    import click

    return click.option("--json", "json_target", metavar="FILE|-",
                        help="Write the report as JSON to FILE, or '-' for stdout (then nothing else is printed).")(fn)


def write_json(target: str, data: Any) -> None:
    import json

    text = json.dumps(data, indent=2, default=str)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(target, "w") as f:
            f.write(text + "\n")
