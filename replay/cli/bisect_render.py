"""A bisect's answer for people, on the terminal: the first bad commit, its probe report beside its
parent's, the probe log (the work is replay.bisect's; rendering lives here, in the command line)."""
from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from replay.bisect.result import BisectResult, ProbeRecord
from replay.bisect.history import CommitInfo

SHORT_LIST = 8  # longer lists in a report are counted, not printed


def render(result: BisectResult) -> RenderableType:
    parts: list[RenderableType] = []
    if result.first_bad is not None:
        parts += [_commit_block(result.first_bad), _side_by_side(result.first_bad_probe, result.parent_probe)]
    else:
        parts.append(Text("Skipped commits leave the first bad commit ambiguous; it is one of:", style="bold"))
        parts.append(_candidates(result))
    parts.append(Text(f"oracle: {result.oracle_note}"))
    parts += [Text(f"warning: {w}", style="yellow") for w in result.warnings]
    parts += [Text(_totals(result)), _probe_log(result)]
    return Group(*parts)


def _commit_block(commit: CommitInfo) -> Text:
    text = Text()
    text.append("First bad commit ", style="bold")
    text.append(commit.sha, style="bold red")
    text.append(f"\n  subject  {commit.subject}\n  author   {commit.author}\n  date     {commit.date}\n")
    for i, (path, added, removed) in enumerate(commit.files):
        text.append(f"  {'files' if i == 0 else '':<8} {path} (+{added} -{removed})\n")
    return text


def _side_by_side(first_bad: ProbeRecord | None, parent: ProbeRecord | None) -> Table:
    table = Table(show_lines=False, expand=True)
    for title, record in (("first bad", first_bad), ("parent", parent)):
        heading = f"{title} {record.sha[:10]}: {record.outcome.verdict} ({record.outcome.reason})" if record \
            else f"{title}: not probed"
        table.add_column(heading, ratio=1, overflow="fold")
    table.add_row(*(Text(probe_summary(r)) if r else "" for r in (first_bad, parent)))
    return table


def probe_summary(record: ProbeRecord) -> str:
    """The JSON report a probe printed, flattened to `key: value` lines, else its output tail."""
    report = record.outcome.report
    if report is not None:
        return "\n".join(_flatten(report))
    return record.outcome.output_tail or "(no output)"


def _flatten(value: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for key, item in value.items():
        name = f"{prefix}{key}"
        if item is None:
            continue
        if isinstance(item, dict):
            lines += _flatten(item, f"{name}.")
        elif isinstance(item, list) and (len(item) > SHORT_LIST or any(isinstance(x, (dict, list)) for x in item)):
            lines.append(f"{name}: list of {len(item)}")
        elif isinstance(item, float):
            lines.append(f"{name}: {item:.4g}")
        else:
            lines.append(f"{name}: {item}")
    return lines


def _candidates(result: BisectResult) -> Table:
    table = Table(box=None)
    for column in ("commit", "subject", "probe"):
        table.add_column(column)
    reasons = {r.sha: f"{r.outcome.verdict}: {r.outcome.reason}" for r in result.probes}
    for commit in result.candidates:
        table.add_row(commit.short, Text(commit.subject), Text(reasons.get(commit.sha, "")))
    return table


def _totals(result: BisectResult) -> str:
    cached = len(result.probes) - result.probes_run
    parts = [f"{result.probes_run_for('search')} search", f"{result.probes_run_for('endpoint')} endpoint checks"]
    if result.probes_run_for("parent"):
        parts.append("1 for the parent's report")
    return (f"{result.probes_run} probes ({', '.join(parts)}) over {result.range_size} commits in "
            f"{result.rounds} rounds, {cached} results from the cache, {result.seconds:.1f} s")


def _probe_log(result: BisectResult) -> Table:
    table = Table(box=None, title="probes", title_justify="left")
    for column in ("#", "commit", "purpose", "round", "verdict", "reason", "time"):
        table.add_column(column)
    for n, record in enumerate(result.probes, 1):
        o = record.outcome
        time = "cached" if record.cached else f"{o.seconds:.2f} s"
        where = f" GPU {record.device}" if record.device is not None else ""
        table.add_row(str(n), record.sha[:10], record.purpose, str(record.round or ""), o.verdict, Text(o.reason),
                      time + where)
    return table
