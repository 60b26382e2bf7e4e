"""Printing replay and diff reports for people: tables, the first divergence, a row heatmap."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.compare import Comparison, row_ranges
from replay.engine import RunReport
from replay.engine.diff import DiffReport

HEATMAP_WIDTH = 64
SIDES = ("A", "B")  # `replay diff A B` compares B against A: its values are named, A's first


def row_heatmap(bad_rows: list[int], rows: int | None) -> str:
    """One character per row ('█' wrong, '·' right), buckets of rows past HEATMAP_WIDTH."""
    if not rows:
        return ""
    per_cell = max(1, -(-rows // HEATMAP_WIDTH))
    bad = set(bad_rows)
    cells = ("█" if any(r in bad for r in range(start, min(start + per_cell, rows))) else "·"
             for start in range(0, rows, per_cell))
    scale = f" ({per_cell} rows per cell)" if per_cell > 1 else ""
    return f"[{''.join(cells)}]{scale}"


def _rows_sentence(bad: list[int], total: int | None) -> str:
    if not bad or not total:
        return ""
    good = [r for r in range(total) if r not in set(bad)]
    text = f"rows {row_ranges(bad)} wrong"
    if good:
        text += f", row{'s' if len(good) > 1 else ''} {row_ranges(good)} right"
    return text


def print_run_report(console: Console, report: RunReport, verbose: bool = False) -> None:
    table = Table(title=f"replay {report.snapshot} ({report.mode}, {report.device})", title_justify="left")
    for column in ("call", "op", "recorded", "checks", "verdict", "first failure"):
        table.add_column(column, overflow="fold")
    for call in report.calls:
        if call.passed and not verbose and len(report.calls) > 40:
            continue
        failures = call.failures
        verdict = ("[yellow]untestable[/]" if call.untestable else
                   "[green]pass[/]" if call.passed else "[red]DIVERGED[/]")
        table.add_row(str(call.index), escape(call.op), escape(call.recorded_variant), str(len(call.checks)), verdict,
                      escape(failures[0].describe() if failures else (call.untestable or "")))
    console.print(table)
    summary = report.summary()
    failed = sum(not c.passed for c in report.calls)
    untestable = next((c for c in report.calls if c.untestable), None)
    if untestable is not None:
        console.print(f"[yellow]call {untestable.index} ({escape(untestable.op)}) cannot be made by this code[/], "
                      "so it is not tested here:")
        console.print(f"  {untestable.untestable}", markup=False, highlight=False)
        return
    if summary is None:
        readable = f" of the {len(report.calls)} readable calls" if report.problems else f" {len(report.calls)} calls"
        console.print(f"[green]all{readable} passed[/] "
                      f"(load {report.load_seconds:.2f}s of {report.total_seconds:.2f}s)")
        return
    console.print(f"[red]{failed} of {len(report.calls)} calls diverged.[/] First: call {summary['call']} "
                  f"op [bold]{escape(summary['op'])}[/], variant [bold]{escape(str(summary['variant']))}[/] "
                  f"({summary['kind']})")
    console.print(f"  {summary['description']}", markup=False, highlight=False)
    sentence = _rows_sentence(summary["rows"], summary["rows_total"])
    if sentence:
        console.print(f"  {sentence}  {row_heatmap(summary['rows'], summary['rows_total'])}", markup=False)
    if summary["tag"]:
        console.print(f"  first diverging tag: [bold]{escape(summary['tag'])}[/]")
        console.print(f"    {summary['tag_description']}", markup=False, highlight=False)
    first = report.first_failure
    for check in (first.failures[1:6] if first else []):
        console.print(f"  also: {check.describe()}", markup=False, highlight=False)


def print_diff_report(console: Console, report: DiffReport, show_all: bool = False) -> None:
    if report.identical:
        console.print(f"[green]identical[/]: {report.calls_compared} calls, every tensor bitwise equal")
        return
    for line in report.structural:
        console.print(f"[red]structure:[/] {escape(line)}")
    shown = report.calls if show_all else report.origins()
    table = Table(title=f"diff {report.a} {report.b}", title_justify="left")
    for column in ("#", "op", "tensor", "difference"):
        table.add_column(column, overflow="fold")
    for call in shown[:50]:
        for d in call.differences[:5]:
            table.add_row(str(call.position), escape(call.op), escape(d["tensor"]), escape(describe_difference(d, SIDES)))
    console.print(table)
    if len(shown) < len(report.calls):
        console.print(f"{len(report.calls) - len(shown)} more calls differ only after their inputs did (knock-on "
                      "differences of the calls above); --all lists them")
    first = report.first()
    if first and "tensor" in first:
        console.print(f"first divergence: call #{first['position']} ({first['op']}, its call {first['ordinal']}), "
                      f"{first['tensor']}: {describe_difference(first, SIDES)}", markup=False, highlight=False)


def describe_difference(d: dict[str, Any], sides: tuple[str, str] | None = None) -> str:
    """A difference in a line; `sides`: the names of what was compared, the expected first (Comparison.first_difference)."""
    c = d.get("comparison")
    if not c:
        return d["problem"]
    text = f"{c['mismatches']}/{c['numel']} elements, max abs {c['max_abs']:.3g}"
    if c.get("bad_rows"):
        text += f", rows {row_ranges(c['bad_rows'])}"
    if d.get("row_counts"):  # compared in the rows both hold
        text = f"{d['problem']}: {text}"
    first = Comparison(**c).first_difference(sides)
    return f"{text}; {first}" if first else text
