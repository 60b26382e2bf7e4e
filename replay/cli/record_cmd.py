"""`replay record -- COMMAND`: record a program that never imports replay; the work is replay.record_program's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from replay import settings
from replay.cli.common import SafeConsole, warn
from replay.record_program import default_snapshot, record_program
from replay.storage import is_url, staging_snapshot, upload_recording


@click.command("record", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", metavar="DIR|URL",
              help="The snapshot directory (new), or a URL (s3://, gs://, file://) to upload it to once "
                   "recorded. Default: snapshots/<program>_NNN, the first number free.")
@click.option("--only", metavar="GLOB,...", help="Record the launches of these kernels (and, with --torch-ops, "
              "calls of these operators) only: globs on package.module.kernel, aten.op.overload or the last part.")
@click.option("--skip", metavar="GLOB,...", help="Do not record the calls of these kernels (or operators).")
@click.option("--calls", metavar="FIRST:END", help="Of each kernel (or operator), record the calls numbered FIRST "
              "(from 0) up to END (either may be left out): 100:110 skips warm-up.")
@click.option("--steps", metavar="FIRST:END", help="Record the launches (and operator calls) made in the program's "
              "steps FIRST up to END, where it marks them with replay.step() (0 before the first mark).")
@click.option("--max-bytes", metavar="SIZE", help="Stop recording once the recorded calls hold SIZE bytes (500M, "
              "2G); the snapshot's manifest and stderr say where it stopped. The program runs on.")
@click.option("--ring", metavar="N", help="A flight recorder: keep only the last N calls, and write them when an "
              "uncaught exception ends the program, on SIGUSR1 (it goes on) or on SIGTERM; a program that ends "
              "normally writes none.")
@click.option("--ring-bytes", metavar="SIZE", help="The flight recorder's budget of host memory (default 1G); a "
              "KV cache counts one whole copy and the pieces each call changed.")
@click.option("--state", metavar="NAME,...", help="More parameter names that hold runtime state (besides "
              "position_buf, seq_len_buf, kv_cache_lengths): stored as the call's state.")
@click.option("--torch-ops", is_flag=True, help="Also record every PyTorch operator call (aten ops, torch.library "
              "custom ops; not views, factories or random draws) made on the main thread outside a recorded call.")
@click.option("--no-triton", is_flag=True, help="Record registered ops and replay.capture functions only, not "
              "every Triton launch.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(output: str | None, only: str | None, skip: str | None, calls: str | None, steps: str | None,
            max_bytes: str | None, ring: str | None, ring_bytes: str | None,
            state: str | None, torch_ops: bool, no_triton: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND unchanged, recording from its first line: every Triton kernel launch (its
    arguments before, what it writes after, its grid and config) and every call of a registered
    op, into a snapshot that `replay run`, `show`, `diff` and `bisect` take.

    The program needs no `import replay`: its Python process imports it first (through a
    sitecustomize put on PYTHONPATH) and writes the snapshot as it exits. The exit code is the
    program's. REPLAY_CAPTURE=DIR with the same options as REPLAY_CAPTURE_* does the same
    inside a program that imports replay.

    \b
    Examples:
      replay record -- python serve.py --prompt "hello"
      replay record -o snapshots/step7 --only 'my_kernels.*' -- python -m mypkg.train
      replay record -o s3://bucket/runs/step7 -- python train.py   # recorded here, then uploaded
      replay record -o snapshots/tp -- torchrun --nproc-per-node 4 train.py   # snapshots/tp/rank-<r>/ each
      replay record --calls 100:110 --skip '*_backward' --max-bytes 2G -- python bench.py
      replay record --ring 1000 -- python serve.py   # the last 1000 calls, written if it crashes
      replay run snapshots/serve_001 --code .     # then replay it against this tree's kernels
    """
    given: list[tuple[settings.Setting[Any], str, str | None]] = [
        (settings.CAPTURE_ONLY, "--only", only), (settings.CAPTURE_SKIP, "--skip", skip),
        (settings.CAPTURE_CALLS, "--calls", calls), (settings.CAPTURE_STEPS, "--steps", steps), (settings.CAPTURE_MAX_BYTES, "--max-bytes", max_bytes),
        (settings.CAPTURE_RING, "--ring", ring), (settings.CAPTURE_RING_BYTES, "--ring-bytes", ring_bytes),
        (settings.CAPTURE_STATE, "--state", state), (settings.CAPTURE_TRITON, "--no-triton", "0" if no_triton else None),
        (settings.CAPTURE_TORCH_OPS, "--torch-ops", "1" if torch_ops else None)]
    environment = {setting.name: _checked(setting, option, value) for setting, option, value in given
                   if value is not None}
    remote = output if output is not None and is_url(output) else None
    if remote is not None and remote.lower().startswith("memory://"):
        raise click.BadParameter("memory:// lives and dies with one process, and the recorded program is another: "
                                 "give a directory, or a URL that outlives it", param_hint="-o")
    if remote is None and output is not None and Path(output).exists() and not Path(output).is_dir():
        raise click.BadParameter(f"{output}: a file, not a snapshot directory", param_hint="-o")
    snapshot = staging_snapshot(remote) if remote else Path(output) if output else default_snapshot(list(command))
    result = record_program(list(command), snapshot, environment)
    if remote and result.recorded:
        from replay.cli.progress import call_progress

        with call_progress(label=lambda rel: f"uploading {rel}", doing="uploading") as told:
            upload_recording(snapshot, remote, told)
    console = SafeConsole(stderr=True)
    flight = bool(settings.CAPTURE_RING.parse(ring.strip())) if ring is not None else False
    if not result.recorded:
        warn(f"nothing recorded: no Python process of `{command[0]}` started recording (it needs a Python with "
             "kernel-replay installed; one run with -I or -S skips the sitecustomize that starts it)")
    elif flight and not result.calls:
        console.print(f"the flight recorder wrote nothing into {escape(remote or str(snapshot))}: the program "
                      "ended with no uncaught exception, SIGUSR1 or SIGTERM", highlight=False)
    else:
        total = sum(result.calls.values())
        ranks = f" (rank-<r>/ for ranks {', '.join(map(str, result.ranks))})" if result.ranks else ""
        recorded = f"the flight recorder wrote its last {total}" if flight else f"recorded {total}"
        console.print(f"{recorded} call{'s' * (total != 1)} into {escape(remote or str(snapshot))}{ranks}"
                      + (":" if total else " (no kernel launched)"), highlight=False)
        for op, count in result.calls.most_common():
            console.print(f"  {count:6d}  {escape(op)}", highlight=False)
        for error in result.capture_errors:
            console.print(f"[yellow]capture error:[/] {escape(error)}")
    raise SystemExit(result.exit_code)


def _checked(setting: settings.Setting[Any], option: str, value: str) -> str:
    """`value` as the recorded program will read it, refused here (exit 2) if it would not be."""
    try:
        setting.parse(value.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: takes {setting.takes}", param_hint=option) from None
    return value
