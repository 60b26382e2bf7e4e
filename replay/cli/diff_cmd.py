"""`replay diff`: two recordings of the same program, compared call by call and tag by tag."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from replay.cli.common import MetricValue, ToleranceValue, finish, json_option, metric_help, write_page
from replay.errors import EXIT_DIVERGED, EXIT_PASS


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--atol", type=ToleranceValue(), help="Absolute tolerance (default: bitwise).")
@click.option("--rtol", type=ToleranceValue(), help="Relative tolerance (default: bitwise).")
@click.option("--metric", type=MetricValue(), help=metric_help(float64_run=False))
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write one self-contained HTML page: the differing calls and, for each call where a "
                   "difference starts, each differing tensor's heatmap, rows, values and histogram of errors.")
@click.option("--all", "show_all", is_flag=True,
              help="List every differing call, also those whose inputs already differ (knock-on differences).")
@json_option
def command(a: Path, b: Path, atol: float | None, rtol: float | None, metric: Any, html_path: Path | None,
            show_all: bool, json_target: str | None) -> None:
    """Compare snapshots A and B (two commits, two devices) call by call: inputs,
    state, tags in recorded order, then outputs; name the first divergence.

    Calls whose inputs already differ only carry an earlier difference along: they
    are counted, not listed (--all lists them). A later call whose inputs agree but
    whose outputs differ is a divergence of its own, and is listed.

    \b
    Example:
      replay diff snapshots/prefill_gpu snapshots/prefill_cpu --atol 1e-3 --rtol 1e-2

    Exit 0 when identical (within tolerance), 1 when they diverge, 2 on bad input.
    """
    from replay.engine.diff import diff_snapshots
    from replay.tolerance import Tolerance

    tolerance = Tolerance(atol or 0.0, rtol or 0.0) if atol is not None or rtol is not None else None
    if metric is not None and metric.needs_float64_run:
        raise click.BadParameter("fp64 compares a kernel with a float64 run of its reference, which a recording "
                                 "has not: use it with replay run", param_hint="--metric")
    report = diff_snapshots(a, b, tolerance, metric, evidence=html_path is not None)
    if html_path is not None:
        from replay.engine.html import diff_page
        write_page(html_path, diff_page(report))
    from replay.cli.render import print_diff_report

    finish(json_target, report.to_json(), lambda console: print_diff_report(console, report, show_all),
           EXIT_PASS if report.identical else EXIT_DIVERGED)
