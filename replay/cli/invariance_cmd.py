"""`replay invariance`: batch invariance of ops, row by row; the work is replay.invariance's."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.cli.common import chosen_device, device_option, finish, json_option, kernel_trust_options
from replay.compare import row_ranges
from replay.errors import EXIT_DIVERGED, EXIT_PASS
from replay.invariance.properties import InvarianceReport, Plan, check_ops
from replay.invariance.recorded import check_snapshot
from replay.code import KernelCode

DTYPES = ("float32", "bfloat16", "float16")


def _sizes(option: str):
    def parse(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, ...]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise click.BadParameter(f"{text!r}: positive numbers of rows, comma-separated", param_hint=option)
        return tuple(dict.fromkeys(int(p) for p in parts))
    return parse


@click.command("invariance")
@click.argument("ops", nargs=-1, metavar="[OP ...]")
@click.option("--batch-sizes", default="1,2,3,8", show_default=True, callback=_sizes("--batch-sizes"),
              help="Batch sizes each row is run in, at every position it can take.")
@click.option("--chunks", default="2,3", show_default=True, callback=_sizes("--chunks"),
              help="Chunk sizes the batch is split into, as a chunked prefill would.")
@click.option("--pad", "pads", default="1,5", show_default=True, callback=_sizes("--pad"),
              help="Rows of padding appended to the batch.")
@click.option("--backward", is_flag=True,
              help="Back-propagate too: input gradients row by row; gradients reduced over the rows "
                   "(a weight's) unchanged by padding.")
@click.option("--snapshot", type=click.Path(path_type=Path), metavar="DIR",
              help="Check the calls recorded in DIR instead, each on its own recorded rows.")
@click.option("--call", "calls", type=int, multiple=True, metavar="N", help="With --snapshot: only call N (repeatable).")
@click.option("--variant", default=None, help="The variant checked (default: batched; with --snapshot, the recorded one).")
@click.option("--example", default=None, metavar="NAME", help="The op example (code path) to run; default: each.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@device_option
@kernel_trust_options
@json_option
def command(ops: tuple[str, ...], batch_sizes: tuple[int, ...], chunks: tuple[int, ...], pads: tuple[int, ...],
            backward: bool, snapshot: Path | None, calls: tuple[int, ...], variant: str | None, example: str | None, dtype: str,
            device: str | None, providers: tuple[str, ...], code_dir: Path | None, json_target: str | None) -> None:
    """Check bit for bit that each row's output of OP is the same alone, inside batches of
    every size at every position, under chunked splits and under padding (no OP: every op
    with examples). The rows are the op's registered example, or with --snapshot each recorded
    call's own rows (padded with its own first rows); ops whose rows share state (a KV cache
    write) are listed as not applicable.

    \b
    Examples:
      replay invariance rmsnorm q4k_gemv
      replay invariance torch_matmul                 # a library GEMM that picks its kernel by M
      replay invariance det_gemm --backward --dtype bfloat16 --device cuda
      replay invariance --batch-sizes 1,2,3,8,17 --chunks 4 --pad 3 --device cuda --json -
      replay invariance --snapshot snapshots/prefill_001 rmsnorm

    Exit 0 when every property holds, 1 when a row changed, 2 on bad input.
    """
    device = chosen_device(device)
    import torch

    plan = Plan(batch_sizes, chunks, pads, backward)
    if snapshot is not None:
        reports = check_snapshot(snapshot, plan, device, ops, calls, variant, providers, code_dir)
    else:
        reports = check_ops(KernelCode(code_dir, providers).ops(ops), variant or "batched", example, plan,
                            getattr(torch, dtype), device)
    passed = all(r.passed for r in reports)
    finish(json_target, {"passed": passed, "device": device, "ops": [r.to_json() for r in reports]},
           lambda console: _print(console, reports), EXIT_PASS if passed else EXIT_DIVERGED)


def _print(console: Console, reports: list[InvarianceReport]) -> None:
    table = Table(title_justify="left", title="batch invariance, bit for bit against each row alone")
    for column in ("op", "example", "property", "size", "calls", "verdict", "rows changed", "max ulp", "first"):
        table.add_column(column, overflow="fold")
    for report in reports:
        if report.skipped:
            table.add_row(escape(report.op), escape(report.example), "-", "-", "-", "[yellow]n/a[/]", "-", "-",
                          escape(report.skipped))
        for r in report.results:
            table.add_row(escape(report.op), escape(report.example), r.prop, str(r.size), str(r.calls),
                          "[green]same[/]" if r.passed else "[red]changed[/]",
                          ", ".join(filter(None, [row_ranges(r.rows_changed), *r.whole_changed])) or "-", "-" if r.max_ulp is None else str(r.max_ulp),
                          escape(r.first) or "-")
    console.print(table)
