"""`replay demo`: the README's main command, on an embedded kernel history."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from replay.cli.common import SafeConsole
from replay.device import use_interpreter_without_gpu
from replay.errors import EXIT_DIVERGED, EXIT_PASS


def _verdict_line(label: str, report: dict[str, Any] | None, exit_code: int | None) -> str:
    if report is None:
        return f"{label}: exit {exit_code}, no report"
    if report.get("passed"):
        return f"{label}: [green]pass[/] ({report['calls_checked']} calls, every check)"
    first = report.get("first_divergence") or {}
    rows = first.get("tag_rows") or first.get("rows") or []
    total = first.get("rows_total")
    where = f"rows {rows} of {total}" if total else f"rows {rows}"
    return (f"{label}: [red]DIVERGED[/] ({report['calls_failed']} of {report['calls_checked']} calls); first: "
            f"call {first.get('call')} [bold]{first.get('op')}[/], variant [bold]{first.get('variant')}[/] "
            f"({first.get('kind')}), first diverging tag [bold]{first.get('tag')}[/] wrong at {where}\n"
            f"    {first.get('description')}")


@click.command("demo")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--jobs", "-j", type=click.IntRange(1), default=1, show_default=True,
              help="Probe this many commits at once while bisecting.")
def command(directory: Path | None, jobs: int) -> None:
    """Run the whole loop on an embedded example, in DIRECTORY (default: a new temp dir).

    \b
    1. build a git repository of ~30 commits of edits to the shipped kernels,
       one of which plants a stale-position_buf bug in the batched kv_scatter;
    2. record the tiny model's prefill at the good tag (v1.2) as a snapshot;
    3. `replay run` it at v1.2 (passes) and at HEAD (fails, naming the call,
       variant, rows and tag);
    4. `replay bisect --good v1.2 --bad HEAD` to the planted commit, step by step.

    Runs on CPU (Triton interpreter) in a few minutes. Exit 0 when the bisect
    names the planted commit.
    """
    use_interpreter_without_gpu()
    from replay.bisect import Step
    from replay.cli.bisect_render import render
    from replay.demo import GOOD_TAG, run_demo

    console = SafeConsole(highlight=False)
    started = time.monotonic()

    def say(message: str) -> None:
        console.print(f"[dim]\\[{time.monotonic() - started:5.1f}s][/] [bold cyan]demo[/] {message}")

    def show(step: Step) -> None:
        console.print(Text.assemble((f"[{time.monotonic() - started:5.1f}s] ", "dim"), (f"{step.kind:>7} ", "dim"),
                                    step.message))

    result = run_demo(directory, say, show, jobs)
    ends = {(p.purpose, p.sha): p for p in result.bisect.probes}
    for label, sha in ((f"replay run at {GOOD_TAG}", result.bisect.good), ("replay run at HEAD", result.bisect.bad)):
        probe = ends.get(("endpoint", sha))
        if probe is not None:
            console.print(_verdict_line(label, probe.outcome.report, probe.outcome.exit_code))
    console.print(render(result.bisect))
    if result.found_planted:
        say(f"[green]found the planted commit {result.planted_sha[:10]}[/] in {time.monotonic() - started:.0f}s; "
            f"poke around: cd {result.repo} && git log --oneline; "
            f"replay run {result.snapshot} --code {result.repo}")
        sys.exit(EXIT_PASS)
    say(f"[red]the bisect did not name the planted commit {result.planted_sha[:10]}[/]")
    sys.exit(EXIT_DIVERGED)
