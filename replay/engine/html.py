"""A replay as one self-contained HTML page: verdicts per call and, for each failing tensor, the
heatmap of its difference, the row map, both sides' values and a histogram of its errors; for a
propagated run, the error of every call along the chain. Pictures are inline SVG (nothing fetched,
no plotting library). DOM contract for tests: each call is a <tr class="call" data-passed>; each
failing tensor a <section class="evidence" data-call data-name> holding <svg class="heatmap">
(one <rect class="cell"> a block), <svg class="rowmap">, <table class="values"> and <svg
class="histogram">; a propagated run's curve is <svg class="error-curve">. After loading,
document.body.dataset.heatmaps holds the number of heatmaps drawn.
"""
from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Iterable

from replay.compare import row_ranges
from replay.engine.evidence import HISTOGRAM, Evidence
from replay.engine.report import RunReport

if TYPE_CHECKING:  # propagate.py imports the session, which imports this module's neighbours
    from replay.engine.diff import DiffReport
    from replay.engine.precision import PrecisionResult
    from replay.engine.propagate import PropagationReport

CELL = 8  # pixels a heatmap cell
CALLS_DRAWN = 20  # failing calls whose tensors a page draws
DECADES = 6  # the heatmap's colour scale: from its largest difference down this many decades
_STYLE = """body{font:13px system-ui,sans-serif;margin:14px;color:#222}h1{font-size:17px}h2{font-size:15px;margin:18px 0 4px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
tr[data-passed="false"] td{background:#fdecec}.bad{color:#b00;font-weight:600}.ok{color:#070}
section.evidence{border:1px solid #ccc;padding:8px;margin:10px 0}.pictures{display:flex;gap:18px;flex-wrap:wrap;
align-items:flex-start}svg text{font-size:10px}"""
_COUNT = ("<script>document.body.dataset.heatmaps = "
          "String(document.querySelectorAll('svg.heatmap').length);</script>")


def page(title: str, body: Iterable[str]) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{"".join(body)}{_COUNT}</body></html>\n')


def run_page(report: RunReport) -> str:
    """The page of `replay run --html`."""
    rows = []
    for call in report.calls:
        why = call.untestable or "; ".join(c.describe() for c in call.failures[:2])
        verdict = "untestable" if call.untestable else "pass" if call.passed else "FAIL"
        rows.append(f'<tr class="call" data-passed="{str(call.passed).lower()}"><td>{call.index}</td>'
                    f'<td>{html.escape(call.op)}</td><td>{html.escape(call.recorded_variant)}</td>'
                    f'<td class="{"ok" if call.passed else "bad"}">{verdict}</td><td>{html.escape(why)}</td></tr>')
    first = report.summary()
    summary = html.escape(f"first divergence: call {first['call']} ({first['op']}): {first['description']}"
                          if first else "every check passed")
    body = [f"<p>{len(report.calls)} calls of {html.escape(report.snapshot)} on {html.escape(report.device)}: "
            f"{summary}</p>",
            "<table><tr><th>call</th><th>op</th><th>variant</th><th>verdict</th><th>first failure</th></tr>",
            *rows, "</table>"]
    failing = [call for call in report.calls if call.evidence]
    body += [evidence_section(e) for call in failing[:CALLS_DRAWN] for e in call.evidence]
    if len(failing) > CALLS_DRAWN:
        body.append(f"<p>{len(failing) - CALLS_DRAWN} more failing calls are not drawn (the first "
                    f"{CALLS_DRAWN} are)</p>")
    return page(f"replay run {report.snapshot}", body)


def diff_page(report: DiffReport) -> str:
    """The page of `replay diff --html`: the calls where a difference starts, then those it reaches."""
    origins = {id(c) for c in report.origins()}
    rows = []
    for call in report.calls:
        start = id(call) in origins
        what = "; ".join(f"{d['tensor']}: {d['problem']}" for d in call.differences[:3])
        rows.append(f'<tr class="call" data-passed="false"><td>{call.index_a}</td><td>{call.index_b}</td>'
                    f"<td>{html.escape(call.op)}</td><td class=\"{'bad' if start else ''}\">"
                    f"{'starts here' if start else 'carried along'}</td><td>{html.escape(what)}</td></tr>")
    body = [f"<p>A {html.escape(report.a)}, B {html.escape(report.b)}: {report.calls_compared} calls compared, "
            f"{len(report.calls)} differ" + "".join(f"; {html.escape(s)}" for s in report.structural) + "</p>",
            "<table><tr><th>A call</th><th>B call</th><th>op</th><th></th><th>what differs</th></tr>", *rows,
            "</table>"]
    starting = [c for c in report.calls if id(c) in origins]
    body += [evidence_section(e) for call in starting[:CALLS_DRAWN] for e in call.evidence]
    return page(f"replay diff {report.a} {report.b}", body)


def precision_page(result: PrecisionResult) -> str:
    """The page of `replay bisect-precision --html`: the sets tried in order, the answer, and the final
    outputs as they are with no call switched."""
    rows = [f'<tr class="set" data-fixed="{str(fixed).lower()}"><td>{i}</td><td>{len(calls)}</td>'
            f"<td>{html.escape(_ranges(calls))}</td><td class=\"{'ok' if fixed else 'bad'}\">"
            f"{'within tolerance' if fixed else 'still off'}</td></tr>" for i, (calls, fixed) in enumerate(result.trail, 1)]
    if result.minimal is not None:
        answer = (f"switch calls {_ranges(result.minimal)}" + (f" ({', '.join(result.groups)})" if result.by != "call"
                                                               else "") + " to their reference")
    else:
        answer = "nothing to switch"
    body = [f"<p>{html.escape(answer)}: {result.tests} sets tested, {result.remembered} answered by the journal, "
            f"{result.replays} call replays; final outputs judged: "
            f"{html.escape(', '.join(f'call {i} {k}' for i, k in result.finals))}</p>",
            "<table><tr><th>set</th><th>calls</th><th>switched to their reference</th><th>final outputs</th></tr>",
            *rows, "</table>", *[evidence_section(e) for e in result.evidence]]
    return page(f"replay bisect-precision {result.snapshot}", body)


def _ranges(calls: list[int]) -> str:
    return row_ranges(sorted(calls)) or "none"


def evidence_section(e: Evidence) -> str:
    values = "".join(f"<tr><td>{c}</td><td>{_number(x)}</td><td>{_number(y)}</td></tr>"
                     for c, x, y in zip(e.columns, e.expected, e.actual))
    return (f'<section class="evidence" data-call="{e.call}" data-name="{html.escape(e.name)}">'
            f"<h2>call {e.call}: {html.escape(e.name)} {list(e.shape)}, {html.escape(e.versus)}</h2>"
            '<div class="pictures">'
            f"<div>|difference|, {e.block[0]} row(s) by {e.block[1]} column(s) a cell (largest in it)"
            f"<br>{heatmap(e)}</div>"
            f"<div>rows with a mismatch<br>{row_map(e)}</div>"
            f'<div>row {e.worst_row} (the worst), from its first mismatch<table class="values"><tr><th>column</th>'
            f"<th>baseline</th><th>replayed</th></tr>{values}</table></div>"
            f"<div>log10 |difference| of the elements that differ{histogram(e)}</div></div></section>")


def _colour(value: float, top: float) -> str:
    """White for 0, through yellow to dark red at `top`, on a log scale over DECADES decades."""
    if value <= 0:
        return "#ffffff"
    if not math.isfinite(value):
        return "#000000"
    share = max(0.0, 1 + (math.log10(value) - math.log10(top)) / DECADES) if top > 0 else 1.0
    return f"hsl({int(55 - 55 * share)},90%,{int(88 - 58 * share)}%)"


def heatmap(e: Evidence) -> str:
    top = max((v for row in e.heat for v in row if math.isfinite(v)), default=0.0)
    cells = [f'<rect class="cell" x="{c * CELL}" y="{r * CELL}" width="{CELL}" height="{CELL}" '
             f'fill="{_colour(v, top)}"><title>rows {r * e.block[0]}+, columns {c * e.block[1]}+: {v:.3g}</title></rect>'
             for r, row in enumerate(e.heat) for c, v in enumerate(row)]
    width, height = CELL * max((len(r) for r in e.heat), default=1), CELL * max(len(e.heat), 1)
    return (f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'{"".join(cells)}</svg><br>largest {top:.3g}')


def row_map(e: Evidence) -> str:
    height = max(2, min(6, 400 // max(len(e.bad_rows), 1)))
    cells = [f'<rect x="0" y="{i * height}" width="14" height="{height}" fill="{"#d62020" if bad else "#cfe8cf"}">'
             f"<title>row {i}</title></rect>" for i, bad in enumerate(e.bad_rows)]
    return (f'<svg class="rowmap" xmlns="http://www.w3.org/2000/svg" width="14" height="{height * len(e.bad_rows)}">'
            f'{"".join(cells)}</svg>')


def histogram(e: Evidence) -> str:
    top = max(e.histogram, default=0) or 1
    low = HISTOGRAM[0]
    bars = []
    for i, count in enumerate(e.histogram):
        h = 80 * count / top
        bars.append(f'<rect x="{i * 14}" y="{90 - h}" width="12" height="{h}" fill="#5b8bd6"><title>1e{low + i}: '
                    f'{count}</title></rect>')
        if i % 4 == 0:
            bars.append(f'<text x="{i * 14}" y="102">{low + i}</text>')
    note = f"<br>{e.beyond_range} outside 1e{HISTOGRAM[0]}..1e{HISTOGRAM[1]}" if e.beyond_range else ""
    return (f'<br><svg class="histogram" xmlns="http://www.w3.org/2000/svg" width="{14 * len(e.histogram)}" '
            f'height="106">{"".join(bars)}</svg>{note}')


def error_curve(own: list[float | None], drift: list[float | None]) -> str:
    """log10 of each call's own error (kernel against reference) and drift (chain against chain)."""
    def y(v: float) -> float:
        return 10 + 180 * (1 - (max(min(math.log10(v), 2), -12) + 12) / 14)

    lines = []
    for which, colour, values in (("own", "#d62020", own), ("drift", "#5b8bd6", drift)):
        xy = [f"{40 + i * 10},{y(v):.1f}" for i, v in enumerate(values) if v is not None and v > 0]
        lines.append(f'<polyline class="{which}" fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{" ".join(xy)}"/>')
    ticks = "".join(f'<text x="2" y="{y(10.0 ** d) + 3:.0f}">1e{d}</text>' for d in range(-12, 3, 2))
    width = 60 + 10 * len(own)
    return (f'<svg class="error-curve" xmlns="http://www.w3.org/2000/svg" width="{width}" height="200">{ticks}'
            f'{"".join(lines)}</svg><br><span style="color:#d62020">own error</span>, '
            '<span style="color:#5b8bd6">drift</span> (max |difference|), one step a call')


def propagation_page(report: PropagationReport) -> str:
    """The page of `replay run --propagate --html`: the chain's verdicts, its error curve, the culprit's
    evidence."""
    rows = []
    for c in report.calls:
        own = f"{c.own.max_abs:.3g}" if c.own else "-"
        drift = f"{c.drift.max_abs:.3g}" if c.drift else "-"
        rows.append(f'<tr class="call" data-passed="{str(c.verdict == "ok").lower()}"><td>{c.index}</td>'
                    f"<td>{html.escape(c.op)}</td><td>{html.escape(' '.join(f'{k} {v}' for k, v in c.scope.items()))}"
                    f'</td><td>{own}</td><td>{drift}</td><td class="{"ok" if c.verdict == "ok" else "bad"}">'
                    f"{c.verdict}</td></tr>")
    culprit = report.culprit
    body = [f"<p>{'first call over its own tolerance: call ' + str(culprit.index) if culprit else 'no call over its own tolerance'}"
            f" ({report.replays} replays)</p>",
            error_curve([c.own.max_abs if c.own else None for c in report.calls],
                        [c.drift.max_abs if c.drift else None for c in report.calls]),
            "<table><tr><th>call</th><th>op</th><th>scope</th><th>own error</th><th>drift</th><th>verdict</th></tr>",
            *rows, "</table>"]
    body += [evidence_section(e) for e in report.evidence]
    return page(f"replay run --propagate {report.snapshot}", body)


def _number(value: float) -> str:
    return f"{value:.8g}"
