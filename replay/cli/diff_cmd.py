"""`replay diff`: two recordings of the same program, compared call by call and tag by tag."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from replay.cli.common import exits_on_replay_error, json_option, write_json
from replay.errors import EXIT_DIVERGED, EXIT_PASS


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--atol", type=float, help="Absolute tolerance (default: bitwise).")
@click.option("--rtol", type=float, help="Relative tolerance (default: bitwise).")
@json_option
@exits_on_replay_error
def command(a: Path, b: Path, atol: float | None, rtol: float | None, json_target: str | None) -> None:
    """Compare snapshots A and B (two commits, two devices) call by call: inputs,
    state, tags in recorded order, then outputs; name the first divergence.

    \b
    Example:
      replay diff snapshots/prefill_gpu snapshots/prefill_cpu --atol 1e-3 --rtol 1e-2

    Exit 0 when identical (within tolerance), 1 when they diverge, 2 on bad input.
    """
    from replay.engine.diff import diff_snapshots
    from replay.registry import Tolerance

    tolerance = Tolerance(atol or 0.0, rtol or 0.0) if atol is not None or rtol is not None else None
    report = diff_snapshots(a, b, tolerance)
    if json_target:
        write_json(json_target, report.to_json())
    if json_target != "-":
        from rich.console import Console
        from replay.cli.render import print_diff_report
        print_diff_report(Console(), report)
    sys.exit(EXIT_PASS if report.identical else EXIT_DIVERGED)
