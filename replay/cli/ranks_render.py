"""Printing what the multi-rank commands found: `replay run`, `diff --ranks` and `show` on a parent
of rank-<r>/ snapshots."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.cli.render import describe_difference, print_run_report
from replay.ranks.agreement import RanksDiffReport
from replay.ranks.run import RanksReport


def print_ranks_report(console: Console, report: RanksReport, verbose: bool) -> None:
    table = Table(title=f"replay {report.parent}: {len(report.ranks)} of {report.world_size} ranks",
                  title_justify="left")
    for column in ("rank", "calls", "failed", "first failure"):
        table.add_column(column, overflow="fold")
    for rank, run in report.ranks.items():
        summary = run.summary()
        said = f"{escape(summary['op'])}: {escape(summary['description'] or '')}" if summary else ""
        verdict = ("[yellow]untestable[/]" if run.untestable else "[green]pass[/]" if summary is None
                   else f"[red]call {summary['call']}[/] {said}")
        table.add_row(str(rank), str(len(run.calls)), str(sum(not c.passed for c in run.calls)), verdict)
    console.print(table)
    for rank, run in report.ranks.items():
        if not run.passed or verbose:
            console.print(f"[bold]rank {rank}[/]")
            print_run_report(console, run, verbose)
    checked = [c for c in report.collectives if c.untested is None and c.uncheckable is None]
    failed = [c for c in report.collectives if not c.passed]
    console.print(f"collectives: {len(checked)} checked across ranks against the ranks' recorded inputs, "
                  f"{len(failed)} failed" + (f", {len(report.collectives) - len(checked)} not checked"
                                               if len(checked) < len(report.collectives) else ""))
    for check in failed[:20]:
        for failure in check.failures[:4]:
            call = check.calls.get(failure["rank"], "-")
            console.print(f"  [red]{check.kind} {check.ordinal}[/] on group {list(check.group)}: rank "
                          f"{failure['rank']} (call {call}) {escape(failure['tensor'])}: "
                          f"{escape(describe_difference(failure))}")
    for check in report.collectives:
        if check.untested or check.uncheckable:
            console.print(f"  [yellow]{check.kind} {check.ordinal} not checked[/]: "
                          f"{escape(check.untested or check.uncheckable or '')}")
    first = report.first_divergence()
    if first is not None:
        console.print(f"first divergence: rank {first['rank']}, call {first['call']} ({first['op']}): "
                      f"{first.get('description') or ''}", markup=False, highlight=False)
    elif report.passed and not report.problems:
        console.print(f"[green]all ranks passed[/]: {sum(len(r.calls) for r in report.ranks.values())} calls, "
                      f"{len(checked)} collectives")


def print_ranks_diff(console: Console, report: RanksDiffReport, show_all: bool) -> None:
    for line in report.structural:
        console.print(f"[red]structure:[/] {escape(line)}")
    if not report.disagreements:
        if not report.structural:
            console.print(f"[green]ranks agree[/]: {report.calls_compared} calls paired across ranks "
                          f"{report.ranks}, their runtime state and collective outputs equal")
        return
    shown = report.disagreements if show_all else report.disagreements[:1] + [
        d for d in report.disagreements[1:] if d.tensor != report.disagreements[0].tensor][:19]
    table = Table(title=f"diff --ranks {report.parent}", title_justify="left")
    for column in ("op", "call", "tensor", "must agree as", "differs on", "difference"):
        table.add_column(column, overflow="fold")
    for d in shown:
        calls = ", ".join(f"{r}:{i}" for r, i in d.calls.items())
        table.add_row(escape(d.op), f"{d.ordinal} ({calls})", escape(d.tensor), d.why,
                      f"rank {', '.join(map(str, d.differing))}",
                      escape(describe_difference({"problem": "", "comparison": d.comparison})))
    console.print(table)
    first = report.disagreements[0]
    against = (f"the other {len(first.reference)} ranks" if first.majority else
               f"rank {first.reference[0]} (no majority among {len(report.ranks)} ranks: the lowest is the reference)")
    console.print(f"first divergence: rank {', '.join(map(str, first.differing))}, "
                  f"call {first.calls[first.differing[0]]} ({first.op}, its call {first.ordinal}), {first.tensor} "
                  f"({first.why}) differs from {against}",
                  markup=False, highlight=False)
