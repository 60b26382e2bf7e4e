"""`replay diff`: two recordings of the same program, compared call by call and tag by tag."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click

from replay.cli.common import (MetricValue, SnapshotLocation, ToleranceValue, finish, json_option, metric_help,
                               write_page)
from replay.errors import EXIT_DIVERGED, EXIT_PASS
from replay.ranks.layout import is_multi_rank


@click.command("diff")
@click.argument("a", type=SnapshotLocation())
@click.argument("b", type=SnapshotLocation(), required=False)
@click.option("--atol", type=ToleranceValue(), help="Absolute tolerance (default: bitwise).")
@click.option("--rtol", type=ToleranceValue(), help="Relative tolerance (default: bitwise).")
@click.option("--metric", type=MetricValue(), help=metric_help(float64_run=False))
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write one self-contained HTML page: the differing calls and, for each call where a "
                   "difference starts, each differing tensor's heatmap, rows, values and histogram of errors.")
@click.option("--all", "show_all", is_flag=True,
              help="List every differing call, also those whose inputs already differ (knock-on differences).")
@click.option("--ranks", "across_ranks", is_flag=True,
              help="A is a multi-rank recording (rank-<r>/ snapshots): pair calls across its ranks and name the first "
                   "call where what must agree does not (runtime state, all_reduce/all_gather/broadcast outputs, "
                   "--replicated arguments), and the rank that differs.")
@click.option("--replicated", multiple=True, metavar="[OP_GLOB:]NAME",
              help="With --ranks: an argument every rank takes whole, compared across ranks too (repeatable).")
@click.option("--shard", "shards", multiple=True, metavar="[OP_GLOB:]NAME=PLACEMENT",
              help="A multi-rank A against an unsharded B: how an argument's pieces make the whole: shard:DIM "
                   "(concatenated along DIM in rank order), partial (summed) or replicate (repeatable). Unnamed "
                   "tensors equal on every rank are replicated, those whose shapes add up along one dimension sharded.")
@json_option
def command(a: Path, b: Path | None, atol: float | None, rtol: float | None, metric: Any, html_path: Path | None,
            show_all: bool, across_ranks: bool, replicated: tuple[str, ...], shards: tuple[str, ...],
            json_target: str | None) -> None:
    """Compare snapshots A and B (two commits, two devices) call by call: inputs,
    state, tags in recorded order, then outputs; name the first divergence.

    Calls whose inputs already differ only carry an earlier difference along: they
    are counted, not listed (--all lists them). A later call whose inputs agree but
    whose outputs differ is a divergence of its own, and is listed. Two batch
    sizes (A of 1 row, B of 8) are compared on the rows both hold.

    B is compared against A (a relative tolerance is of A's values): a first
    difference reads "first at [i, j]: A <value> vs B <value>", and in --json
    "first_expected" is A's value, "first_actual" B's.

    A multi-rank recording (a directory of rank-<r>/ snapshots, as `replay record -- torchrun ...`
    writes) takes --ranks alone, is compared rank by rank with another multi-rank recording, or
    is put back together (--shard) and compared with a recording of the unsharded model.

    \b
    Examples:
      replay diff snapshots/prefill_gpu snapshots/prefill_cpu --atol 1e-3 --rtol 1e-2
      replay diff --ranks snapshots/tp_001                   # which rank left the others
      replay diff snapshots/tp_001 snapshots/single_001 --shard 'matmul_kernel:c_ptr=partial' --atol 1e-5

    Exit 0 when identical (within tolerance), 1 when they diverge, 2 on bad input.
    """
    from replay.engine.diff import diff_snapshots
    from replay.tolerance import Tolerance

    tolerance = Tolerance(atol or 0.0, rtol or 0.0) if atol is not None or rtol is not None else None
    if metric is not None and metric.needs_float64_run:
        raise click.BadParameter("fp64 compares a kernel with a float64 run of its reference, which a recording "
                                 "has not: use it with replay run", param_hint="--metric")
    if across_ranks or is_multi_rank(a):
        _diff_multi_rank(a, b, across_ranks, replicated, shards, tolerance, metric, html_path, show_all, json_target)
    if replicated or shards:
        raise click.BadParameter("takes a multi-rank recording as A", param_hint="--replicated/--shard")
    if b is None:
        raise click.BadParameter("missing: the snapshot to compare A with", param_hint="B")
    report = diff_snapshots(a, b, tolerance, metric, evidence=html_path is not None)
    if html_path is not None:
        from replay.engine.html import diff_page
        write_page(html_path, diff_page(report))
    from replay.cli.render import print_diff_report

    finish(json_target, report.to_json(), lambda console: print_diff_report(console, report, show_all),
           EXIT_PASS if report.identical else EXIT_DIVERGED)


def _diff_multi_rank(a: Path, b: Path | None, across_ranks: bool, replicated: tuple[str, ...], shards: tuple[str, ...],
                     tolerance: Any, metric: Any, html_path: Path | None, show_all: bool,
                     json_target: str | None) -> NoReturn:
    """--ranks on A alone; A's ranks against B's, rank by rank; or A put together against B."""
    from replay.cli.render import print_diff_report

    if html_path is not None:
        raise click.BadParameter("is not drawn for a multi-rank recording yet", param_hint="--html")
    if across_ranks:
        if b is not None or shards or metric is not None:
            raise click.BadParameter("compares A's ranks with each other: give A alone, without --shard or --metric "
                                     "(--atol/--rtol apply)", param_hint="--ranks")
        from replay.cli.ranks_render import print_ranks_diff
        from replay.ranks.agreement import diff_ranks

        agreement = diff_ranks(a, replicated, tolerance)
        finish(json_target, agreement.to_json(), lambda console: print_ranks_diff(console, agreement, show_all),
               EXIT_PASS if agreement.agree else EXIT_DIVERGED)
    if b is None:
        raise click.BadParameter("missing: a multi-rank A is compared across its ranks (--ranks) or with B",
                                 param_hint="B")
    if replicated:
        raise click.BadParameter("goes with --ranks", param_hint="--replicated")
    if is_multi_rank(b):
        if shards:
            raise click.BadParameter("puts A's ranks together against an unsharded B; B has ranks too",
                                     param_hint="--shard")
        from replay.ranks.shards import diff_rank_by_rank

        each = diff_rank_by_rank(a, b, tolerance, metric)

        def show(console: Any) -> None:
            for line in each.structural:
                console.print(f"[red]structure:[/] {line}")
            for rank, report in each.ranks.items():
                console.print(f"[bold]rank {rank}[/]")
                print_diff_report(console, report, show_all)
        finish(json_target, each.to_json(), show, EXIT_PASS if each.identical else EXIT_DIVERGED)
    from replay.ranks.shards import diff_sharded, parse_placements

    merged = diff_sharded(a, b, parse_placements(shards), tolerance, metric)
    finish(json_target, merged.to_json(), lambda console: print_diff_report(console, merged, show_all),
           EXIT_PASS if merged.identical else EXIT_DIVERGED)
