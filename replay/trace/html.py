"""A trace as one self-contained HTML page: a zoomable timeline drawn by inline JavaScript.

Nothing is fetched at view time (no CDN, no fonts), so the page opens from a CI artifact or
an air-gapped machine. DOM contract for tests: every slice is one SVG <rect> carrying
data-kind and data-name; after drawing, document.body.dataset.rendered holds the slice count.
"""
from __future__ import annotations

import html
import json
import math
from typing import Any

# Placeholders hold "<", which neither filled value can contain (the title is HTML-escaped,
# the JSON has "<" as \u003c), so one value can never be mistaken for the other's placeholder.
_TITLE = "<%TITLE%>"
_SLICES = "<%SLICES%>"

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title><%TITLE%></title>
<style>
body{font:13px system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:17px;margin:0 0 6px}
#failing div{color:#b00;font-weight:600;cursor:pointer}
#bar{margin:6px 0;display:flex;gap:12px;align-items:center;flex-wrap:wrap}
#legend span{display:inline-flex;align-items:center;gap:4px;margin-right:10px}
#legend i{display:inline-block;width:12px;height:12px;border-radius:2px}
#wrap{border:1px solid #ccc;user-select:none}
svg{display:block;width:100%;cursor:grab}
svg text{font-size:11px;pointer-events:none}
#detail{background:#f6f6f6;border:1px solid #ddd;padding:8px;min-height:2em;white-space:pre-wrap}
</style></head>
<body>
<h1><%TITLE%></h1>
<div id="failing"></div>
<div id="bar"><button id="reset">reset</button><span id="legend"></span></div>
<div id="wrap"><svg id="tl"></svg></div>
<p>wheel: zoom at cursor, drag: pan, click: details</p>
<pre id="detail"></pre>
<script type="application/json" id="slices"><%SLICES%></script>
<script>
"use strict";
const slices = JSON.parse(document.getElementById("slices").textContent);
const svg = document.getElementById("tl"), NS = "http://www.w3.org/2000/svg";
const AXIS = 22, ROW = 22, detail = document.getElementById("detail");
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
// FNV-1a over the op name: the same op gets the same hue in every page.
function colour(s) {
  if (s.kind === "step") return "#b8b8b8";
  if (s.kind === "layer") return "#d8d8d8";
  let h = 2166136261;
  for (const c of s.cat) { h ^= c.codePointAt(0); h = Math.imul(h, 16777619); }
  return "hsl(" + ((h >>> 0) % 360) + ",60%,62%)";
}
function fmt(t, step) {
  if (step >= 1000) return +(t / 1000).toFixed(Math.max(0, 3 - Math.round(Math.log10(step)))) + " ms";
  return +t.toFixed(Math.max(0, -Math.floor(Math.log10(step)))) + " \\u00b5s";
}
function show(s) {
  const head = s.name + "  [" + s.kind + (s.cat ? " " + s.cat : "") + "]\\nts " + s.ts + " \\u00b5s, dur " + s.dur + " \\u00b5s";
  detail.textContent = head + "\\n" + JSON.stringify(s.args, null, 2);
}
const lanes = slices.reduce((m, s) => Math.max(m, s.depth + 1), 1);
const H = AXIS + lanes * ROW + 4;
svg.setAttribute("height", H);
// reduce, not Math.min(...xs): spreading a long trace overflows the argument stack.
const lo = slices.length ? slices.reduce((m, s) => Math.min(m, s.ts), Infinity) : 0;
const hi = slices.length ? slices.reduce((m, s) => Math.max(m, s.ts + s.dur), -Infinity) : 1;
let t0 = lo, t1 = hi > lo ? hi : lo + 1;
const grid = el("g", {}, svg), body = el("g", {}, svg);
// Elements are made once; zoom and pan only move them, so the element count stays exact.
const items = slices.map(s => {
  const y = AXIS + s.depth * ROW + 2;
  const r = el("rect", {y: y, height: ROW - 4, rx: 2, fill: colour(s), "data-kind": s.kind, "data-name": s.name}, body);
  if (s.highlight) { r.setAttribute("stroke", "#e00"); r.setAttribute("stroke-width", 3); }
  el("title", {}, r).textContent = s.name + " (" + s.dur + " \\u00b5s)";
  r.addEventListener("click", () => { if (!moved) show(s); });
  const label = el("text", {y: y + ROW - 9}, body);
  return {s, r, label};
});
function layout() {
  const W = svg.clientWidth || 1000, k = W / (t1 - t0);
  grid.textContent = "";
  const raw = (t1 - t0) / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(v => v >= raw);
  // Counting ticks by index: t += step can stall when step is below t's float resolution.
  for (let i = Math.ceil(t0 / step); i * step <= t1; i++) {
    const t = i * step, x = (t - t0) * k;
    el("line", {x1: x, x2: x, y1: AXIS - 4, y2: H, stroke: "#eee"}, grid);
    el("text", {x: x + 2, y: AXIS - 8, fill: "#555"}, grid).textContent = fmt(t, step);
  }
  for (const {s, r, label} of items) {
    const x = (s.ts - t0) * k, w = Math.max(s.dur * k, 1);
    r.setAttribute("x", x);
    r.setAttribute("width", w);
    // Label only the visible part of a slice, cut to the characters that fit (~6.5px each).
    const vx = Math.max(x, 0), vw = Math.min(x + w, W) - vx, n = Math.floor((vw - 6) / 6.5);
    label.setAttribute("x", vx + 3);
    label.textContent = n >= 3 ? (s.name.length > n ? s.name.slice(0, n - 1) + "\\u2026" : s.name) : "";
  }
}
function zoomTo(a, b) { t0 = a; t1 = Math.max(b, a + 1e-3); layout(); }
document.getElementById("reset").onclick = () => zoomTo(lo, hi > lo ? hi : lo + 1);
svg.addEventListener("wheel", e => {
  e.preventDefault();
  const mx = e.clientX - svg.getBoundingClientRect().left;
  const f = Math.exp(e.deltaY * 0.002), tc = t0 + mx / svg.clientWidth * (t1 - t0);
  zoomTo(tc - (tc - t0) * f, tc + (t1 - tc) * f);
}, {passive: false});
let drag = null, moved = false;
svg.addEventListener("mousedown", e => { drag = {x: e.clientX, t0, t1}; moved = false; });
window.addEventListener("mousemove", e => {
  if (!drag) return;
  const dx = e.clientX - drag.x, dt = dx / svg.clientWidth * (drag.t1 - drag.t0);
  if (Math.abs(dx) > 3) moved = true;
  if (moved) zoomTo(drag.t0 - dt, drag.t1 - dt);
});
window.addEventListener("mouseup", () => { drag = null; });
window.addEventListener("resize", layout);
const legend = document.getElementById("legend"), seen = new Set();
for (const s of slices) {
  if ((s.kind !== "call" && s.kind !== "kernel") || seen.has(s.cat)) continue;
  seen.add(s.cat);
  const item = document.createElement("span"), sw = document.createElement("i");
  sw.style.background = colour({kind: "call", cat: s.cat});
  item.append(sw, s.cat);
  legend.appendChild(item);
}
for (const s of slices.filter(s => s.highlight)) {
  const d = document.createElement("div");
  d.textContent = "failing call: " + s.name + (s.cat ? " (" + s.cat + ")" : "") + " at " + s.ts + " \\u00b5s";
  d.onclick = () => { zoomTo(s.ts - s.dur, s.ts + 2 * s.dur); show(s); };
  document.getElementById("failing").appendChild(d);
}
if (!slices.length) el("text", {x: 12, y: AXIS + 14, fill: "#777"}, svg).textContent = "no calls";
layout();
document.body.dataset.rendered = String(items.length);
</script>
</body></html>
"""


def _json_safe(value: Any) -> Any:
    """`value` with non-finite floats as strings: JSON.parse rejects the NaN/Infinity that
    json.dumps writes, and a NaN metric is exactly what a failing call's args may hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def render_html(title: str, slices: list[dict]) -> str:
    """One self-contained HTML page (no network at view time: no CDN, no external fonts/scripts)
    drawing `slices` as a zoomable timeline."""
    # "<" as \u003c keeps "</script>" or "<!--" in a name or arg from ending the script element;
    # default=str covers arg values the recorder passes through as objects (dtypes, devices).
    data = json.dumps(_json_safe(slices), default=str).replace("<", "\\u003c")
    return _TEMPLATE.replace(_TITLE, html.escape(title)).replace(_SLICES, data)
