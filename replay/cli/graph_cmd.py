"""`replay graph`: which call produced what each call read, and the races between streams."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from replay.cli.common import SnapshotLocation, error, finish, json_option
from replay.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_PASS


@click.command("graph")
@click.argument("snapshot", type=SnapshotLocation())
@click.option("--dot", "dot_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the graph in Graphviz DOT to FILE ('-' for stdout).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write one self-contained HTML page drawing the graph to FILE.")
@json_option
def command(snapshot: Path, dot_path: Path | None, html_path: Path | None, json_target: str | None) -> None:
    """Link each call of SNAPSHOT to the calls that wrote the bytes it read (the
    dependency graph), and report races: two calls on different CUDA streams
    touching the same bytes, one writing, with no event or wait ordering them;
    and reads of uninitialised memory: bytes of a buffer that recorded calls
    write their outputs into (first seen fresh, as a kernel's write-only
    argument) that no recorded call wrote.

    The links come from each call's memory footprint (device, bytes, storage and
    version counter of every tensor, kept since format 4 recordings of this
    version): bytes rewritten by something not recorded, or memory freed and
    allocated again, link to nothing. Stream order comes from the waits the
    program made through torch.cuda (Event.record/wait/synchronize,
    Stream.synchronize, torch.cuda.synchronize); a wait hidden in .item() or
    .cpu() is not seen, so a race across one is a false alarm.

    \b
    Examples:
      replay graph snap                      # summary and races
      replay graph snap --html graph.html    # the picture
      replay graph snap --dot - | dot -Tsvg > graph.svg

    Exit 0 with no race or uninitialised read, 1 with one, 2 on bad input (a
    snapshot recorded without footprints says so).
    """
    from replay.dataflow import render
    from replay.dataflow.graph import checked, of_snapshot
    from replay.snapshot import Snapshot

    graph, problems = of_snapshot(Snapshot(snapshot, strict=False))
    checked(graph, snapshot, every_call=False)
    missing = graph.without_footprint
    if dot_path is not None:
        text = render.to_dot(graph)
        click.echo(text, nl=False) if str(dot_path) == "-" else dot_path.write_text(text)
    if html_path is not None:
        html_path.write_text(render.to_html(graph, f"replay graph {snapshot}"))

    def show(console: Console) -> None:
        console.print(f"{snapshot}: {len(graph.nodes)} calls, {len(graph.edges)} links from producer to reader, "
                      f"{sum(bool(n.state) for n in graph.nodes)} calls reading runtime state")
        if missing:
            console.print(f"calls without a footprint (not linked): {', '.join(map(str, missing[:20]))}")
        for race in graph.races:
            console.print(f"[bold red]race[/]: {escape(race.describe())}")
        for unwritten in graph.unwritten:
            console.print(f"[bold red]uninitialised[/]: {escape(unwritten.describe())}")
        if not graph.races:
            console.print("no races: every pair of calls touching the same bytes, one writing, is ordered")
        if html_path is not None:
            console.print(f"graph drawn in {html_path}")
        for problem in problems:
            error(problem)

    quiet_dot = str(dot_path) == "-"
    data = render.to_json(graph) | {"problems": problems}
    code = EXIT_BAD_INPUT if problems else EXIT_DIVERGED if graph.races or graph.unwritten else EXIT_PASS
    finish(json_target, data, (lambda console: None) if quiet_dot else show, code)
