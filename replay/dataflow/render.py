"""A dependency graph as JSON, Graphviz DOT, or one self-contained HTML page (inline SVG).

The page draws calls top to bottom in issue order and each edge as an arc on the left from the
call that wrote the bytes to the call that read them, labelled with the tensor read; runtime
state (`state/...`) and buffers calls write in place (a KV cache's pages) in their own colours,
races in red. Nothing is fetched at view time. DOM contract for tests: each call is a <g
class="call" data-call=N>, each edge a <path class="edge" data-kind=...>, each race a <path
class="race">.
"""
from __future__ import annotations

import html
import json
from typing import Any

from replay.dataflow.graph import CallNode, DependencyGraph, Edge

ROW = 24  # pixels a call
LEFT = 60  # the arcs' margin, grown with the longest arc
COLOURS = {"data": "#5b8bd6", "state": "#e08a1e", "in place": "#8a4fc2", "race": "#d62020"}


def edge_kind(edge: Edge, producer: CallNode) -> str:
    """'state' for runtime state read, 'in place' for a buffer its producer read and wrote (a KV
    cache's pages), 'data' otherwise."""
    if edge.consumer_key.startswith("state/"):
        return "state"
    name = edge.producer_key.partition("/")[2]
    return "in place" if f"in/{name}" in producer.reads or f"state/{name}" in producer.reads else "data"


def _kinds(graph: DependencyGraph) -> list[str]:
    nodes = {n.index: n for n in graph.nodes}
    return [edge_kind(e, nodes[e.producer]) for e in graph.edges]


def to_json(graph: DependencyGraph) -> dict[str, Any]:
    return {
        "calls": [{"index": n.index, "op": n.op, "variant": n.variant, "scope": n.scope, "stream": n.stream,
                   "footprint": n.footprint, "state": n.state} for n in graph.nodes],
        "edges": [{"producer": e.producer, "consumer": e.consumer, "producer_key": e.producer_key,
                   "consumer_key": e.consumer_key, "kind": kind, "device": e.place.device,
                   "bytes": e.place.end - e.place.start} for e, kind in zip(graph.edges, _kinds(graph))],
        "races": [{"first": r.first, "second": r.second, "first_key": r.first_key, "second_key": r.second_key,
                   "kind": r.kind, "device": r.place.device, "start": r.place.start, "end": r.place.end,
                   "message": r.describe()} for r in graph.races],
        "unwritten": [{"reader": u.reader, "key": u.key, "device": u.place.device, "start": u.place.start,
                       "end": u.place.end, "message": u.describe()} for u in graph.unwritten],
        "without_footprint": graph.without_footprint,
    }


def _label(node: CallNode) -> str:
    where = " ".join(f"{k} {v}" for k, v in node.scope.items())
    return f"#{node.index} {node.op}" + (f" ({where})" if where else "")


def to_dot(graph: DependencyGraph) -> str:
    lines = ["digraph calls {", "  node [shape=box, fontname=monospace];"]
    for n in graph.nodes:
        lines.append(f"  c{n.index} [label={json.dumps(_label(n))}];")
    for e, kind in zip(graph.edges, _kinds(graph)):
        lines.append(f"  c{e.producer} -> c{e.consumer} [label={json.dumps(e.consumer_key)}, "
                     f"color=\"{COLOURS[kind]}\"];")
    for r in graph.races:
        lines.append(f"  c{r.first} -> c{r.second} [label={json.dumps('race: ' + r.kind)}, color=\"{COLOURS['race']}\", "
                     "style=dashed, constraint=false];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_html(graph: DependencyGraph, title: str) -> str:
    rows = {n.index: i for i, n in enumerate(graph.nodes)}
    span = max((abs(rows[e.consumer] - rows[e.producer]) for e in graph.edges), default=1)
    margin = LEFT + min(span, 40) * 6
    parts = []
    for e, kind in zip(graph.edges, _kinds(graph)):
        parts.append(_arc(rows[e.producer], rows[e.consumer], margin, COLOURS[kind], "edge", kind,
                          f"#{e.producer} {e.producer_key} \u2192 #{e.consumer} {e.consumer_key} "
                          f"({e.place.end - e.place.start} bytes)", e.consumer_key))
    for r in graph.races:
        parts.append(_arc(rows[r.first], rows[r.second], margin, COLOURS["race"], "race", r.kind, r.describe(),
                          "race"))
    for n in graph.nodes:
        y = rows[n.index] * ROW + ROW
        state = " \u25cf state: " + ", ".join(n.state) if n.state else ""
        parts.append(f'<g class="call" data-call="{n.index}"><circle cx="{margin}" cy="{y}" r="4" fill="#333"/>'
                     f'<text x="{margin + 10}" y="{y + 4}">{html.escape(_label(n))}'
                     f'<tspan fill="{COLOURS["state"]}">{html.escape(state)}</tspan></text></g>')
    height = (len(graph.nodes) + 1) * ROW
    legend = " ".join(f'<span style="color:{c}">\u25a0 {k}</span>' for k, c in COLOURS.items())
    found = [r.describe() for r in graph.races] + [u.describe() for u in graph.unwritten]
    races = "".join(f"<li>{html.escape(text)}</li>" for text in found)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            '<style>body{font:13px system-ui,sans-serif;margin:12px;color:#222}svg text{font-size:12px;'
            'font-family:monospace}.races li{color:#b00}</style></head><body>'
            f'<h1 style="font-size:17px">{html.escape(title)}</h1>'
            f'<p>{len(graph.nodes)} calls, {len(graph.edges)} edges, {len(graph.races)} races. {legend}</p>'
            f'<ul class="races">{races}</ul>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{margin + 700}" height="{height}">{"".join(parts)}</svg>'
            '</body></html>\n')


def _arc(a: int, b: int, margin: int, colour: str, cls: str, kind: str, title: str, label: str) -> str:
    y0, y1 = a * ROW + ROW, b * ROW + ROW
    bend = margin - 12 - min(abs(b - a), 40) * 6
    dash = ' stroke-dasharray="4 3"' if cls == "race" else ""
    return (f'<path class="{cls}" data-kind="{html.escape(kind)}" d="M{margin} {y0} C{bend} {y0} {bend} {y1} '
            f'{margin} {y1}" fill="none" stroke="{colour}" stroke-width="1.4"{dash}><title>{html.escape(title)}'
            f'</title></path><text x="{bend + 2}" y="{(y0 + y1) / 2 + 4}" fill="{colour}" font-size="10">'
            f'{html.escape(label.partition("/")[2] or label)}</text>')
