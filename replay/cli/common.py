"""What every command shares: bad input as one stderr line and its exit code, and the ending
(JSON if asked, the human report unless the JSON went to stdout, the exit code), each in one place."""
from __future__ import annotations

import json
import math
import os
import sys
import traceback
from typing import Any, Callable, NoReturn

import click
from rich.console import Console

from replay.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, ReplayError


class ReplayGroup(click.Group):
    """The `replay` group, where every command ends the same way: a ReplayError becomes
    `replay: error: ...` on stderr and its exit code (2 bad input, 125 untestable code);
    Ctrl-C exits 130; any other exception is a bug in this tool, said so on one line, exit 70
    (never 1, which `git bisect run` would take for a divergence)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayError as exc:
            click.echo(f"replay: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("replay: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if os.environ.get("REPLAY_TRACEBACK") == "1":
                traceback.print_exc()
            message = " ".join(str(exc).split())
            click.echo(f"replay: internal error (a bug in kernel-replay, please report it): {type(exc).__name__}: "
                       f"{message} (REPLAY_TRACEBACK=1 prints the traceback)", err=True)
            ctx.exit(EXIT_INTERNAL)


class ToleranceValue(click.ParamType):
    """A tolerance: a finite number >= 0 (NaN would make every comparison pass)."""

    name = "FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return number


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json FILE|-`: write the report as JSON to FILE, or to stdout (and print nothing else)."""
    return click.option("--json", "json_target", metavar="FILE|-",
                        help="Write the report as JSON to FILE, or '-' for stdout (then nothing else is printed).")(fn)


def write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str)
    if target == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        with open(target, "w") as f:
            f.write(text + "\n")
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{target}: cannot write the JSON report: {getattr(exc, 'strerror', None) or exc}") from None


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
