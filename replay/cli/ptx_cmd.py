"""`replay ptx`: parse PTX files and check their kernels; the work is replay.ptx's."""
from __future__ import annotations

import fnmatch
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from replay.cli.common import finish, json_option
from replay.errors import EXIT_DIVERGED, EXIT_PASS, ReplayError


@click.command("ptx")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--kernel", "kernel_glob", metavar="GLOB", default="*", show_default=True,
              help="Only kernels whose name matches GLOB.")
@json_option
def command(files: tuple[Path, ...], kernel_glob: str, json_target: str | None) -> None:
    """Check the kernels in PTX FILES from any compiler (nvcc, Triton, by hand): shared memory
    addressed with 32-bit registers, which grid axes each kernel reads, which pointer
    parameters it dereferences (def-use from ld.param through address arithmetic to global
    loads and stores: does it read position_buf?), and local memory (spills).

    \b
    Examples:
      replay ptx build/kernels.ptx
      replay ptx ~/.triton/cache/*/kv_scatter*.ptx --kernel '*scatter*' --json -

    Exit 0 when every rule holds, 1 on a violation, 2 on an unreadable or malformed file
    (one line naming the file and line).
    """
    from replay.ptx import analyse, parse

    reports = []
    for path in files:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReplayError(f"{path}: unreadable: {getattr(exc, 'strerror', None) or exc}") from None
        for kernel in parse(text, str(path)).kernels:
            if fnmatch.fnmatchcase(kernel.name, kernel_glob):
                reports.append((str(path), analyse(kernel)))
    if not reports:
        raise ReplayError(f"no kernel matching {kernel_glob!r} in {', '.join(map(str, files))}")
    violated = any(report.violations for _, report in reports)
    data = {"passed": not violated, "kernels": [{"file": path, **report.to_json()} for path, report in reports]}
    finish(json_target, data, lambda console: _print(console, reports), EXIT_DIVERGED if violated else EXIT_PASS)


def _print(console: Console, reports: list) -> None:
    if not console.is_terminal:
        console.width = 200  # piped output: keep kernel names whole
    table = Table(title_justify="left", title=f"{len(reports)} kernels")
    for column in ("file", "kernel", "grid axes read", "params read", "params written", "local", "verdict"):
        table.add_column(column, overflow="fold")
    for path, report in reports:
        verdict = "[red]" + "; ".join(f"line {v.line}: {v.message}" for v in report.violations) + "[/]" \
            if report.violations else "[green]ok[/]"
        table.add_row(path, report.name, ", ".join(report.axes_read) or "-", ", ".join(report.params_read) or "-",
                      ", ".join(report.params_written) or "-", str(report.local_accesses), verdict)
    console.print(table)
