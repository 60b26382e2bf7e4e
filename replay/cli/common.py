"""What every command shares: bad input as one stderr line and its exit code, and the ending
(JSON if asked, the human report unless the JSON went to stdout, the exit code), each in one place."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn

import click
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from replay import settings
from replay.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, ReplayError
from replay.settings import SettingError
from replay.storage import as_url


class ReplayGroup(click.Group):
    """The `replay` group, where every command ends the same way: a ReplayError becomes
    `replay: error: ...` on stderr and its exit code (2 bad input, 125 untestable code);
    Ctrl-C exits 130; any other exception is a bug in this tool, said so on one line, exit 70.
    Inside a git bisect, bad input and internal errors exit 255 instead (`for_git_bisect`)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """click's main, ending here rather than in click: a Ctrl-C while the arguments are parsed
        is 130 (click's own ending would be 1, "bad" to git bisect run), and every exit code goes
        through for_git_bisect."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            with _library_reports_on_stderr():
                code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
        except (click.Abort, KeyboardInterrupt):
            click.echo("replay: interrupted", err=True)
            code = EXIT_INTERRUPTED
        except SystemExit as exc:
            if not isinstance(exc.code, int) and exc.code is not None:
                raise
            code = exc.code
        raise SystemExit(for_git_bisect(code if isinstance(code, int) else 0))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplayError as exc:
            click.echo(f"replay: error: {one_line(as_url(str(exc)))}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("replay: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _wants_traceback():
                traceback.print_exc()
            click.echo(f"replay: internal error (a bug in kernel-replay, please report it): {type(exc).__name__}: "
                       f"{one_line(str(exc))} (REPLAY_TRACEBACK=1 prints the traceback)", err=True)
            ctx.exit(EXIT_INTERNAL)


class _OneLine(logging.Handler):
    """What the library reports, to whatever stderr is when it is said, one printable line each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(one_line(record.getMessage()) + "\n")
        except Exception:  # noqa: BLE001 (logging's own rule: a report that cannot be written is dropped)
            self.handleError(record)


@contextlib.contextmanager
def _library_reports_on_stderr() -> Iterator[None]:
    """For the length of a command, what the library logs at WARNING and above (capture errors, a
    damaged bisect cache, verify's mismatches) is printed on stderr as the command's own lines;
    a program using the library decides for itself where its reports go."""
    logger, handler = logging.getLogger("replay"), _OneLine(logging.WARNING)
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


# `git bisect run` reads 0 as good, 125 as skip, 1-127 as bad, and stops at 128 and above
EXIT_STOP_BISECT = 255
_NOT_VERDICTS = {EXIT_BAD_INPUT: "bad input", EXIT_INTERNAL: "an internal error"}


def for_git_bisect(code: int) -> int:
    """The exit code to leave with: `code`, except that bad input (2) and an internal error (70)
    become EXIT_STOP_BISECT while a git bisect is in progress where replay runs, since `git
    bisect run replay run ...` would read them as a bad commit. Neither says anything of the
    commit; stopping the bisect lets the user mend what is wrong."""
    if code not in _NOT_VERDICTS or not _git_bisect_in_progress():
        return code
    click.echo(f"replay: exit {EXIT_STOP_BISECT} instead of {code} ({_NOT_VERDICTS[code]}): a git bisect is in "
               f"progress here, and git bisect run would take {code} for a bad commit; {EXIT_STOP_BISECT} stops it",
               err=True)
    return EXIT_STOP_BISECT


def _git_bisect_in_progress() -> bool:
    """Whether the repository holding the working directory is being bisected (BISECT_START exists)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--git-path", "BISECT_START"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git: no bisect either
        return False
    return found.returncode == 0 and Path(found.stdout.strip()).is_file()


PIPED_WIDTH = 200  # a report piped to a file or a log: tables keep their rows whole, not folded to 80 columns
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but tab and newline, DEL, C1


class SafeConsole(Console):
    """rich's Console, printing control characters as their escapes: text from a snapshot (an op
    called "x\\x1b[2J") is shown as it is written and cannot drive the terminal. rich's own
    styles and cursor moves are segments of their own, and pass."""

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                segment = Segment(_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), segment.text),
                                  segment.style)
            yield segment


def _wants_traceback() -> bool:
    try:
        return settings.TRACEBACK.get()
    except SettingError:  # a bug is being reported: a malformed setting does not hide it
        return False


def cuda_targets(text: str, option: str, one: bool = False) -> list[int]:
    """`sm_80,sm_89,sm_90` (or `90`) as [80, 89, 90]: the one parser of CUDA targets; with `one`,
    exactly one."""
    try:
        found = [int(part.strip().removeprefix("sm_")) for part in text.split(",") if part.strip()]
    except ValueError:
        found = []
    if not found or (one and len(found) != 1):
        raise click.BadParameter(f"{text!r}: {'a target looks like sm_90' if one else 'targets look like sm_80,sm_90'}",
                                 param_hint=option)
    return found


class SnapshotLocation(click.ParamType):
    """A snapshot's directory, or its URL (s3://, gs://, memory://, file://): fetched into the local
    cache (replay/storage) and read from there; what cannot be fetched is a SnapshotError (exit 2)."""

    name = "SNAPSHOT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from replay.cli.progress import call_progress
        from replay.storage import is_url, local_snapshot

        if isinstance(value, Path) or not is_url(str(value)):
            return Path(value)
        with call_progress(label=lambda rel: f"fetching {rel}", doing="fetching") as told:
            return local_snapshot(str(value), progress=told)


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


class MetricValue(click.ParamType):
    """A metric and its bound, `nmse:1e-6` (replay/metrics.py)."""

    name = "METRIC"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from replay import metrics
        try:
            return metrics.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def metric_help(float64_run: bool = True) -> str:
    """--metric's help; `float64_run` where the command can run references in float64 (fp64)."""
    fp64 = (", fp64:FACTOR (no further from a float64 run of the reference than the reference is, times "
            "FACTOR)") if float64_run else ""
    return ("How a comparison with an oracle passes instead of element by element within the tolerance: bitwise, "
            "ulp:N, max_abs:T, max_rel:T, nmse:T, rel_diff:T, cosine:MIN, beyond:SHARE (of elements more than "
            f"1e-3 off){fp64}. Every comparison's values are in --json whatever the metric.")


def write_page(path: Path, text: str) -> None:
    """An HTML report written where asked, or bad input naming the path."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise ReplayError(f"{path}: cannot write the page: {exc.strerror or exc}") from None


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json FILE|-`: write the report as JSON to FILE, or to stdout (and print nothing else)."""
    return click.option("--json", "json_target", metavar="FILE|-",
                        help="Write the report as JSON to FILE, or '-' for stdout (then nothing else is printed).")(fn)


def write_json(target: str, data: Any) -> None:
    text = json.dumps(finite_json(data), indent=2, default=str, allow_nan=False)
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
        console = SafeConsole(highlight=False)
        if not console.is_terminal:
            console.width = PIPED_WIDTH
        show(console)
    sys.exit(exit_code)


def warn(message: str) -> None:
    click.echo(f"replay: warning: {one_line(as_url(message))}", err=True)


def error(message: str) -> None:
    """Bad input met on the way, said as ReplayGroup says a ReplayError, when the command still reports."""
    click.echo(f"replay: error: {one_line(as_url(message))}", err=True)


def one_line(message: str) -> str:
    """`message` as one printable line: names from a snapshot (an op called "x\nall good") cannot
    start a line of their own; control characters are shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)


def finite_json(value: Any) -> Any:
    """`value` with non-finite floats as the strings "nan", "inf", "-inf": strict JSON for any reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


device_option = click.option("--device", type=click.Choice(["cpu", "cuda"]),
                             help="Where to run (default: cuda if present, else cpu with the Triton interpreter).")


def chosen_device(device: str | None) -> str:
    """The device kernels run on: `device` if given and present, else cuda when present, else the
    CPU with Triton's interpreter (chosen before triton is first imported)."""
    from replay.device import use_interpreter_without_gpu

    available = use_interpreter_without_gpu()
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if device == "cuda" and available != "cuda":
        raise click.BadParameter("no CUDA device is present", param_hint="--device")
    return device or available


def kernel_trust_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--provider MOD` and `--code DIR`: the kernel modules a command may import (replay/trust.py)."""
    fn = click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
                      help="Packages at the top of DIR are trusted kernel modules.")(fn)
    return click.option("--provider", "providers", multiple=True, metavar="MOD",
                        help="Trust and import MOD, a module declaring ops or kernels (see replay run --help).")(fn)

