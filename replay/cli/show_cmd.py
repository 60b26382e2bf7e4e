"""`replay show`: list a snapshot's calls and tensors, export them as .npy."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from replay.cli.common import SnapshotLocation, finish, json_option
from replay.cli.progress import call_progress
from replay.ranks.layout import is_multi_rank, rank_path, rank_set
from replay.summary import Selection, SnapshotSummary, summarise
from replay.snapshot import Snapshot
from replay.snapshot.callfile import ROLES

COLUMNS = ("call", "op", "variant", "role", "name", "dtype", "shape", "strides",
           "min", "max", "mean", "nan", "inf")


@click.command("show")
@click.argument("snapshot", type=SnapshotLocation())
@click.option("--call", "calls", type=int, multiple=True, metavar="N", help="Only call N (repeatable).")
@click.option("--op", "ops", multiple=True, metavar="NAME", help="Only calls of op NAME (repeatable).")
@click.option("--role", "roles", type=click.Choice(ROLES), multiple=True,
              help="Only tensors of this role (repeatable): in (arguments before the call), "
                   "out (outputs and mutated arguments after it), state, tag (intermediates).")
@click.option("--export", "export_dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write the chosen tensors to DIR as .npy, one file per tensor named "
                   "<call>-<op>-<role>-<name>.npy; bfloat16 and fp8 are written as float32 (exact).")
@json_option
def command(snapshot: Path, calls: tuple[int, ...], ops: tuple[str, ...], roles: tuple[str, ...],
            export_dir: Path | None, json_target: str | None) -> None:
    """List the calls and tensors of SNAPSHOT: index, op, variant, role, name, dtype,
    shape, strides, min/max/mean (over finite elements) and NaN/inf counts.

    Every file read is checked against its sha256; a corrupt, truncated or unknown
    file is an error naming it (exit 2).

    \b
    Examples:
      replay show snapshots/prefill_001
      replay show snapshots/prefill_001 --op kv_scatter --role state
      replay show snapshots/prefill_001 --call 17 --export /tmp/call17
      replay show snapshots/prefill_001 --json - | jq '.calls[0].tensors'
    """
    selection = Selection(calls, ops, roles)
    if is_multi_rank(snapshot):
        _show_ranks(snapshot, selection, export_dir, json_target)
    with call_progress(quiet=json_target == "-") as progress:
        summary = summarise(Snapshot(snapshot), selection, export_dir, progress)
    finish(json_target, summary.to_json(), lambda console: _print_summary(console, summary, export_dir), 0)


def _show_ranks(parent: Path, selection: Selection, export_dir: Path | None, json_target: str | None) -> NoReturn:
    """Each rank of a multi-rank recording as its own snapshot (exported under DIR/rank-<r>/)."""
    members = rank_set(parent)
    summaries = {}
    with call_progress(quiet=json_target == "-") as progress:
        for rank, path in members.ranks.items():
            summaries[rank] = summarise(Snapshot(path), selection, rank_path(export_dir, rank) if export_dir else None,
                                        progress)

    def show(console: Console) -> None:
        console.print(f"multi-rank recording {parent}: ranks {', '.join(map(str, summaries))} of {members.world_size}"
                      f" (run {members.run_id})", markup=False, highlight=False)
        for problem in members.problems:
            console.print(f"[yellow]warning:[/] {escape(problem)}")
        for rank, summary in summaries.items():
            _print_summary(console, summary, rank_path(export_dir, rank) if export_dir else None)
    finish(json_target, {"snapshot": str(parent), "world_size": members.world_size, "run_id": members.run_id,
                         "problems": list(members.problems),
                         "ranks": {str(rank): summary.to_json() for rank, summary in summaries.items()}}, show, 0)


def _print_summary(console: Console, summary: SnapshotSummary, export_dir: Path | None) -> None:
    console.print(_describe_manifest(summary), markup=False, highlight=False)
    for error in summary.manifest.get("capture_errors", []):
        console.print(f"[yellow]capture error:[/] {escape(str(error))}")
    tensors = [t for c in summary.calls for t in c.tensors]
    captions = [text for text, shown in (
        ("* stored once by content (blobs/, packs/), shared between calls", any(t.by_content for t in tensors)),
        ("† an output buffer before its call: what the elements the call overwrote held was not recorded "
         "(--json: overwritten); the statistics are of the others",
         any(t.overwritten is not None for t in tensors))) if shown]
    table = Table(title_justify="left", title=f"{len(summary.calls)} of {summary.calls_in_snapshot} calls",
                  caption="\n".join(captions) or None,
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in COLUMNS:
        table.add_column(column, overflow="fold",  # a narrow terminal folds cells rather than dropping them
                         justify="right" if column in ("call", "min", "max", "mean", "nan", "inf") else "left")
    for call in summary.calls:
        rows = []
        if call.triton is not None:
            rows.append(["launch", escape(_launch_line(call.triton))] + [""] * (len(COLUMNS) - 5))
        if call.args:
            rows.append(["args", escape(", ".join(f"{k}={json.dumps(v)}" for k, v in call.args.items()))]
                        + [""] * (len(COLUMNS) - 5))
        for t in call.tensors:
            strides = _tuple(t.stride) + (f" +{t.storage_offset}" if t.storage_offset else "")
            name = escape(t.name) + ("†" if t.overwritten is not None else "")
            rows.append([t.role, name, t.dtype + ("*" if t.by_content else ""), _tuple(t.shape), strides,
                         _number(t.min), _number(t.max), _number(t.mean), _count(t.nan), _count(t.inf)])
        for n, row in enumerate(rows):
            first = n == 0  # the call's index, op and variant head its group of rows
            table.add_row(str(call.index) if first else "", escape(call.op) if first else "",
                          escape(call.variant) if first else "", *row)
        table.add_section()
    console.print(table)
    if export_dir is not None:
        exported = [t for c in summary.calls for t in c.tensors if t.exported]
        widened = sum(t.exported_dtype != t.dtype for t in exported)
        note = f" ({widened} bfloat16/fp8 tensors written as float32)" if widened else ""
        console.print(f"exported {len(exported)} tensors to {export_dir}{note}", markup=False, highlight=False)


def _launch_line(launch: dict[str, Any]) -> str:
    """grid (3, 1, 1), num_warps=4; autotuned: BLOCK=8, num_stages=3"""
    tuned = launch.get("autotune") or {}
    given = [f"{k}={json.dumps(v)}" for k, v in launch.get("options", {}).items() if k not in tuned]
    line = ", ".join([f"grid ({', '.join(str(g) for g in launch.get('grid', []))})", *given])
    return line + ("; autotuned: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in tuned.items()) if tuned else "")


def _describe_manifest(summary: SnapshotSummary) -> str:
    m = summary.manifest
    env = m.get("environment") or {}
    git = (m.get("producer") or {}).get("git") or {}
    parts = [f"snapshot {summary.path}", f"format {m.get('format_version')}", f"created {m.get('created', '?')}"]
    distributed = m.get("distributed") or {}
    if "rank" in distributed:
        parts.append(f"rank {distributed['rank']} of {distributed.get('world_size', '?')}"
                     + (f" ({distributed['backend']})" if distributed.get("backend") else ""))
    if git.get("commit"):
        parts.append(f"git {str(git['commit'])[:12]}{' (dirty)' if git.get('dirty') else ''}")
    parts += [f"{key} {env[key]}" for key in ("device", "torch", "triton", "cuda") if env.get(key)]
    if m.get("notes"):
        parts.append(f"notes: {m['notes']}")
    return " | ".join(parts)


def _tuple(values: list[int]) -> str:
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _number(value: Any) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def _count(n: int) -> str:
    return f"[red]{n}[/]" if n else "0"
