"""`replay ptx`: parse PTX files and check their kernels; the work is replay.ptx's."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from replay.cli.common import finish, json_option
from replay.errors import EXIT_DIVERGED, EXIT_PASS


@click.command("ptx")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--snapshot", type=click.Path(path_type=Path), metavar="DIR",
              help="Compile exactly the Triton kernels and constexprs that ran in snapshot DIR (its launch records).")
@click.option("--arch", "archs", default="sm_90", show_default=True, metavar="sm_80,sm_89,...",
              help="CUDA targets to compile --snapshot's kernels for, comma-separated.")
@click.option("--provider", "providers", multiple=True, metavar="MOD",
              help="Trust MOD as a module --snapshot's launches may name (see replay run --help).")
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Packages at the top of DIR are trusted kernel modules.")
@click.option("--kernel", "kernel_glob", metavar="GLOB", default="*", show_default=True,
              help="Only kernels whose name matches GLOB.")
@json_option
def command(files: tuple[Path, ...], snapshot: Path | None, archs: str, providers: tuple[str, ...],
            code_dir: Path | None, kernel_glob: str, json_target: str | None) -> None:
    """Check the kernels in PTX FILES from any compiler (nvcc, Triton, by hand): shared memory
    addressed with 32-bit registers, which grid axes each kernel reads, which pointer
    parameters it dereferences (def-use from ld.param through address arithmetic to global
    loads and stores: does it read position_buf?), and local memory (spills).

    \b
    Examples:
      replay ptx build/kernels.ptx
      replay ptx ~/.triton/cache/*/kv_scatter*.ptx --kernel '*scatter*' --json -
      replay ptx --snapshot snapshots/prefill_001 --arch sm_90   # minutes on a CPU: the GEMV tiles

    Exit 0 when every rule holds, 1 on a violation, 2 on an unreadable or malformed file
    (one line naming the file and line).
    """
    from replay.ptx.check import check_sources
    from replay.ptx.sources import file_ptx, snapshot_ptx

    if not files and snapshot is None:
        raise click.UsageError("give PTX FILES, or --snapshot DIR")
    sources = [file_ptx(path) for path in files]
    if snapshot is not None:
        sources += snapshot_ptx(snapshot, _archs(archs), providers, code_dir)
    report = check_sources(sources, kernel_glob)
    finish(json_target, report.to_json(), lambda console: _print(console, report.kernels),
           EXIT_PASS if report.passed else EXIT_DIVERGED)


def _archs(text: str) -> list[int]:
    try:
        found = [int(a.strip().removeprefix("sm_")) for a in text.split(",") if a.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: targets look like sm_80,sm_89,sm_90", param_hint="--arch") from None
    if not found:
        raise click.BadParameter("no target given", param_hint="--arch")
    return found


def _print(console: Console, reports: list) -> None:
    if not console.is_terminal:
        console.width = 200  # piped output: keep kernel names whole
    table = Table(title_justify="left", title=f"{len(reports)} kernels")
    for column in ("source", "kernel", "grid axes read", "params read", "params written", "local", "verdict"):
        table.add_column(column, overflow="fold")
    for path, report in reports:
        verdict = "[red]" + "; ".join(f"line {v.line}: {v.message}" for v in report.violations) + "[/]" \
            if report.violations else "[green]ok[/]"
        table.add_row(path, report.name, ", ".join(report.axes_read) or "-", ", ".join(report.params_read) or "-",
                      ", ".join(report.params_written) or "-", str(report.local_accesses), verdict)
    console.print(table)
