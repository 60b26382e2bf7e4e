"""`replay repro`: one recorded call as a directory that reproduces it without kernel-replay."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from replay.cli.common import chosen_device, device_option, finish, json_option, kernel_trust_options
from replay.errors import EXIT_DIVERGED, EXIT_PASS


@click.command("repro")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--call", "index", type=int, required=True, help="The recorded call to reproduce (its index).")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True, metavar="DIR",
              help="Where to write it (a new or empty directory).")
@device_option
@kernel_trust_options
@json_option
def command(snapshot: Path, index: int, output: Path, device: str | None, code_dir: Path | None,
            providers: tuple[str, ...], json_target: str | None) -> None:
    """Write call INDEX of SNAPSHOT as a directory that reproduces it with torch,
    safetensors and the kernel's own code only: call.safetensors (arguments and
    expected outputs), call.json, code/ (the kernel's package, and a stand-in for
    kernel-replay's registration API where it imports replay) and repro.py, which
    runs the call, prints a line per output and exits 1 when one diverges.

    What is expected: the op's reference, run here on the recorded inputs, within
    the op's tolerance; for a recorded Triton launch without one, what the
    recording stored after it, bit for bit. Send the directory to whoever owns the
    kernel: `python DIR/repro.py` (`--code THEIR_CHECKOUT` tries their version).

    \b
    Examples:
      replay repro snapshots/prefill_001 --call 5 -o /tmp/q6k_call5
      python /tmp/q6k_call5/repro.py

    Exit 0 when written and the call agrees here, 1 when written and it
    diverges here, 2 on bad input, 125 when this code cannot make the call.
    """
    device = chosen_device(device)
    from replay.engine import ReplayOptions
    from replay.engine.repro import make_repro

    made = make_repro(snapshot, index, output, ReplayOptions(device=device, code_dir=code_dir,
                                                             providers=frozenset(providers)))

    def show(console: Console) -> None:
        verdict = "agrees" if made.passed else "[bold red]diverges[/]"
        console.print(f"{made.describe}: {verdict} here (against the {made.against} outputs); written to {output}")
        console.print(f"reproduce it anywhere with torch and safetensors: python {output / 'repro.py'}")

    finish(json_target, {"directory": str(output), "call": index, "against": made.against,
                         "agrees": made.agrees_here, "passed": made.passed}, show,
           EXIT_PASS if made.passed else EXIT_DIVERGED)
