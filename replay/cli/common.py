"""What every command shares: bad input as one stderr line and its exit code, and the ending
(JSON if asked, the human report unless the JSON went to stdout, the exit code), each in one place."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, NoReturn

import click
from rich.console import Console

from replay.errors import ReplayError


class ReplayGroup(click.Group):
    """The `replay` group: a ReplayError raised by any command becomes `replay: error: ...` on
    stderr and the error's exit code (2 for bad input, 125 for untestable code)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayError as exc:
            click.echo(f"replay: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json FILE|-`: write the report as JSON to FILE, or to stdout (and print nothing else)."""
    return click.option("--json", "json_target", metavar="FILE|-",
                        help="Write the report as JSON to FILE, or '-' for stdout (then nothing else is printed).")(fn)


def write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(target, "w") as f:
            f.write(text + "\n")


def finish(json_target: str | None, data: dict[str, Any], show: Callable[[Console], None], exit_code: int) -> NoReturn:
    """End a reporting command: `data` as JSON to `json_target` if given, `show` the report to a
    person unless the JSON went to stdout, then exit with `exit_code`."""
    if json_target:
        write_json(json_target, data)
    if json_target != "-":
        show(Console(highlight=False))
    sys.exit(exit_code)


def warn(message: str) -> None:
    click.echo(f"replay: warning: {message}", err=True)
