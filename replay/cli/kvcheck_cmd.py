"""`replay kv-check`: serial, batched and chunked prefills must leave the same KV cache; the work is
replay.kv's."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from replay.cli.common import SafeConsole, chosen_device, device_option, finish, json_option
from replay.errors import EXIT_DIVERGED, EXIT_PASS
from replay.kv.caches import KvReport, check_snapshot
from replay.snapshot import Snapshot


@click.command("kv-check")
@click.argument("snapshot", required=False, type=click.Path(path_type=Path))
@click.option("--model", default="tiny", show_default=True, metavar="NAME|module:factory",
              help="The model to drive: a name from the 'replay.models' entry points, or module:factory "
                   "(factory(device) -> adapter; see replay/kv/adapter.py).")
@click.option("--prompt-len", type=click.IntRange(1), default=8, show_default=True, help="Prompt tokens.")
@click.option("--chunks", default="1,4,N", show_default=True, metavar="C,C,...",
              help="Chunked-prefill sizes to run beside the serial one; N is the whole prompt in one call.")
@click.option("--decode-steps", type=click.IntRange(0), default=4, show_default=True,
              help="Decode steps after each prefill.")
@device_option
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Import the --model module from DIR first (a package or a loose module at its top).")
@click.option("--keep", "keep_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="Keep the recording of the runs in DIR (for replay trace or replay run); default: a temporary one.")
@json_option
def command(snapshot: Path | None, model: str, prompt_len: int, chunks: str, decode_steps: int, device: str | None,
            code_dir: Path | None, keep_dir: Path | None, json_target: str | None) -> None:
    """Check that the KV cache does not depend on how the prompt was prefilled. The model
    prefills the same prompt serially (a token at a time, the decode path), batched, and in
    each chunk size, then runs the same decode steps; the KV cache each run leaves is compared
    with the serial run's bitwise at every written position (pages not yet used may hold
    anything), kv_cache_lengths exactly, and the last logits bitwise. Every cache write is
    checked against the state it read: seq_len_buf holds its rows, and position_buf (or the
    positions given) continues kv_cache_lengths. A difference names run, layer, K or V,
    head, positions, and the call that should have written them, with the path it took.

    With SNAPSHOT, the same checks on a recording, but the logits (not recorded as such): its
    runs are told apart by replay.scope("run", name), the first being the baseline (another
    engine can write one); the options that drive a model do not apply.

    \b
    Examples:
      replay kv-check                                   # the tiny model, on CPU or GPU
      replay kv-check --prompt-len 16 --chunks 3,N --decode-steps 8 --keep /tmp/kv
      replay kv-check --model my_engine.adapter:make --code .   # your model, from this directory
      replay trace /tmp/kv --op kv_scatter              # what each run's cache writes read
      replay kv-check /tmp/kv                           # the checks again, on the recording

    Exit 0 when every run agrees, 1 on a difference or a stale state buffer, 2 on bad input.
    """
    kept: str | None  # where the recording is, if one is kept
    if snapshot is not None:
        report, kept = check_snapshot(Snapshot(snapshot)), str(snapshot)
    else:
        device = chosen_device(device)
        from replay.code import KernelCode
        from replay.kv.adapter import load_factory

        from replay.kv.runs import RunPlan, check_model, parse_chunks

        status = SafeConsole(stderr=True, quiet=json_target == "-")
        factory = load_factory(model, KernelCode(code_dir).module)
        report = check_model(factory, device, RunPlan(prompt_len, parse_chunks(chunks), decode_steps),
                             keep_dir, lambda name: status.print(f"kv-check: {name} run"))
        kept = str(keep_dir) if keep_dir else None
    finish(json_target, {**report.to_json(), "recording": kept}, lambda console: _print(console, report, kept),
           EXIT_PASS if report.passed else EXIT_DIVERGED)


def _print(console: Console, report: KvReport, recording: str | None) -> None:
    kept = f" (recording kept in {escape(recording)})" if recording else ""
    console.print(f"kv-check: {report.layers} layers, {report.positions} positions; baseline "
                  f"{escape(report.runs[0])}, compared: {escape(', '.join(report.runs[1:])) or 'none'}{kept}")
    for finding in report.findings:
        console.print(f"[red]{finding.kind}[/] {escape(f'[{finding.run}]')} {escape(finding.message)}")
    if not report.passed:
        console.print(f"[red]{len(report.findings)} finding(s)[/]")
    elif len(report.runs) < 2:
        console.print("[yellow]one run only: every cache write read the right state; no run to compare against[/]")
    else:
        console.print("[green]every run left the same KV cache and read the right state[/]")
