"""`replay trace`: a snapshot's calls by step and layer with their kernel launches; the work is
replay.trace's."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.cli.common import cuda_targets, finish, json_option, kernel_trust_options, warn
from replay.errors import EXIT_PASS, ReplayError
from replay.snapshot import Snapshot
from replay.snapshot.files import write_atomic
from replay.trace.chrome import chrome_trace
from replay.trace.html import render_html
from replay.trace.resources import fill_resources
from replay.trace.slices import timeline_slices
from replay.trace.timeline import TimelineCall, build_timeline, failing_calls, scope_filter
from replay.code import KernelCode


@click.command("trace")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--op", "ops", multiple=True, metavar="NAME", help="Only calls of op NAME (repeatable).")
@click.option("--call", "calls", type=int, multiple=True, metavar="N", help="Only call N (repeatable).")
@click.option("--step", "steps", multiple=True, metavar="S", help="Only calls of step S (repeatable).")
@click.option("--layer", "layers", multiple=True, metavar="L", help="Only calls of layer L (repeatable).")
@click.option("--chrome", "chrome_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write Chrome trace-event JSON to FILE (open it in ui.perfetto.dev or chrome://tracing).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write one self-contained HTML page drawing the timeline (zoom: wheel; pan: drag).")
@click.option("--report", "report_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="A `replay run ... --json FILE` report: its failing calls are highlighted.")
@click.option("--resources", "resources_arch", metavar="sm_90",
              help="Registers, shared memory and stack of launches recorded without them (on a CPU), from "
                   "compiling each kernel for this target with no GPU (seconds a kernel; cached by Triton).")
@kernel_trust_options
@json_option
def command(snapshot: Path, ops: tuple[str, ...], calls: tuple[int, ...], steps: tuple[str, ...],
            layers: tuple[str, ...], chrome_file: Path | None, html_file: Path | None, report_file: Path | None,
            resources_arch: str | None, providers: tuple[str, ...], code_dir: Path | None,
            json_target: str | None) -> None:
    """The timeline of SNAPSHOT: for each step and layer (the replay.scope labels the model
    recorded), each call's op, variant, start and duration, key parameters (scalar arguments,
    positions, position_buf, seq_len_buf, kv_cache_lengths) and each kernel it launched: grid,
    warps, stages, registers, shared memory, and which path ran (direct positions, or
    indirect through position_buf).

    \b
    Examples:
      replay trace snapshots/prefill_001 --layer 0
      replay trace snapshots/prefill_001 --op kv_scatter --resources sm_90
      replay trace snapshots/prefill_001 --chrome prefill.json --html prefill.html
      replay run snap --json run.json; replay trace snap --html snap.html --report run.json
    """
    opened = Snapshot(snapshot)
    wanted_ops, wanted_calls = set(ops), set(calls)
    timeline = build_timeline(opened, lambda e: (not ops or e.op in wanted_ops) and
                              (not calls or e.index in wanted_calls), scope_filter(steps, layers))
    if resources_arch is not None:
        (arch,) = cuda_targets(resources_arch, "--resources", one=True)
        for reason in fill_resources(timeline, arch, KernelCode(code_dir, providers).trust):
            warn(f"--resources: {reason}; its launches are shown without registers")
    failing = failing_calls(report_file) if report_file else set()
    slices = timeline_slices(timeline, failing)
    title = f"replay trace {snapshot}"
    if chrome_file is not None:
        _write(chrome_file, json.dumps(chrome_trace(slices, title)))
    if html_file is not None:
        _write(html_file, render_html(title, [s.to_json() for s in slices]))
    data = {"snapshot": str(snapshot), "calls": [c.to_json() for c in timeline], "failing_calls": sorted(failing)}
    finish(json_target, data, lambda console: _print(console, timeline, failing), EXIT_PASS)


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text.encode())
    except OSError as exc:
        raise ReplayError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _print(console: Console, timeline: list[TimelineCall], failing: set[int]) -> None:
    table = Table(title_justify="left", title=f"{len(timeline)} calls")
    for column in ("step", "layer", "call", "op", "variant", "kernel", "grid", "warps", "regs", "smem", "path",
                   "key parameters", "ms"):
        table.add_column(column, overflow="fold")
    for call in timeline:
        style = "red" if call.index in failing else None
        launches = call.launches or [{}]
        for n, launch in enumerate(launches):
            first = n == 0
            table.add_row(_cell(call.step) if first else "", _cell(call.layer) if first else "",
                          str(call.index) if first else "", escape(call.op) if first else "",
                          escape(call.variant) if first else "", escape(str(launch.get("kernel", "-"))),
                          _cell(launch.get("grid")),
                          _cell(launch.get("num_warps")), _cell(launch.get("registers")), _cell(launch.get("shared")),
                          _cell(launch.get("path")), escape(_params(call.params)) if first else "",
                          f"{call.duration_s * 1e3:.3f}" if first and call.duration_s is not None else "",
                          style=style)
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return escape("x".join(map(str, value)) if isinstance(value, list) else str(value))


def _params(params: dict[str, Any]) -> str:
    def shown(value: Any) -> str:
        if isinstance(value, dict):
            return f"{value['first']}... ({value['of']})"
        return str(value)
    return "; ".join(f"{name}={shown(value)}" for name, value in params.items())
