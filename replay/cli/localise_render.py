"""How `replay run --propagate` and `replay bisect-precision` print their answers."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.compare import Comparison, row_ranges
from replay.engine.precision import PrecisionResult
from replay.engine.propagate import PropagationReport

_STYLE = {"own error": "bold red", "inherits": "yellow", "error": "bold red", "ok": "green"}


def _error(c: Comparison | None) -> str:
    if c is None:
        return "-"
    return "0" if c.bitwise_equal else f"{c.max_abs:.3g}" + ("" if c.passed else " (over)")


def _scope(scope: dict) -> str:
    return escape(" ".join(f"{k} {v}" for k, v in scope.items()))


def print_propagation(console: Console, report: PropagationReport, verbose: bool) -> None:
    """The calls whose verdict is not ok (every call with `verbose`), then the answer."""
    table = Table("call", "op", "scope", "own error", "drift", "verdict", "fed from producers")
    shown = [c for c in report.calls if verbose or c.verdict != "ok"]
    for c in shown:
        table.add_row(str(c.index), escape(c.op), _scope(c.scope), _error(c.own), _error(c.drift),
                      f"[{_STYLE[c.verdict]}]{c.verdict}[/]", escape(", ".join(k.partition("/")[2] for k in c.fed)))
    if shown:
        console.print(table)
    culprit = report.culprit
    inherited = [c.index for c in report.calls if c.verdict == "inherits"]
    if culprit is not None:
        console.print(f"first call over its own tolerance: call {culprit.index} ({escape(culprit.op)}"
                      f"{', ' + _scope(culprit.scope) if culprit.scope else ''}): "
                      f"{escape(culprit.own.first_difference() if culprit.own else '')}")
    for c in report.calls:
        if c.error:
            console.print(f"[bold red]call {c.index} ({escape(c.op)}) could not be replayed[/]: {escape(c.error)}")
    if inherited:
        console.print(f"{len(inherited)} calls only inherit error (their own stays within tolerance): "
                      f"{row_ranges(inherited)}")
    if report.passed:
        console.print(f"all {len(report.calls)} calls within tolerance along the chain ({report.replays} replays)")


def print_precision(console: Console, result: PrecisionResult) -> None:
    judged = ", ".join(f"call {i} {k}" for i, k in result.finals)
    console.print(f"final outputs judged: {escape(judged)}")
    tests = f"{result.tests} sets tested" + (f", {result.remembered} answered by the journal" if result.remembered
                                             else "")
    if result.minimal is None:
        console.print(f"the final outputs are within tolerance of the reference chain: nothing to switch ({tests})")
    else:
        sets = "" if result.by == "call" else f" ({escape(', '.join(result.groups))})"
        console.print(f"[bold]switch {len(result.minimal or [])} of {len(result.candidates)} calls{sets}[/] to their "
                      f"reference and the final outputs are within tolerance: calls {row_ranges(result.minimal or [])} "
                      f"({tests}, {result.replays} call replays)")
        if result.worst is not None and result.worst.first_difference():
            console.print(f"without a switch: {escape(result.worst.first_difference())}")
