"""`replay bisect-precision`: the fewest calls to run as their reference for the end to be right."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import click
from rich.console import Console

from replay.cli.common import chosen_device, device_option, finish, json_option, kernel_trust_options, write_page
from replay.errors import EXIT_DIVERGED, EXIT_PASS


@click.command("bisect-precision")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--journal", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Where the sets tested are kept as they are learnt, so a stopped search goes on where it was "
                   "(default: precision-journal.json inside SNAPSHOT, which readers ignore).")
@click.option("--fresh", is_flag=True, help="Ignore the journal and keep none.")
@click.option("--by", type=click.Choice(["call", "op", "layer"]), default="call", show_default=True,
              help="What is switched together: each call alone, every call of an op, or every call of a layer "
                   "(the `layer` scope of replay.scope).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write one self-contained HTML page: the sets tried, the answer, and each final output "
                   "that is off with no call switched (heatmap, rows, values, histogram of errors).")
@device_option
@kernel_trust_options
@json_option
def command(snapshot: Path, journal: Path | None, fresh: bool, by: str, html_path: Path | None, device: str | None,
            code_dir: Path | None, providers: tuple[str, ...], json_target: str | None) -> None:
    """Find the smallest set of calls of SNAPSHOT whose switch to their op's
    reference variant brings the final outputs (what no later call read: the
    logits, say) within tolerance of the all-reference run.

    Calls run in dependency order, each fed what its producers made (as
    `replay run --propagate`), the switched ones as their reference. The search
    is delta debugging over arbitrary sets, not only prefixes or suffixes: one
    call alone responsible is found in about 2 log2(calls) runs of the
    recording. The journal is keyed by the snapshot and the source of the
    kernels, so after an edit the search starts again.

    \b
    Examples:
      replay bisect-precision snap
      replay bisect-precision snap --by layer            # which layer, then which call
      replay bisect-precision snap --code ../kernels-at-head --json -

    Calls without a reference (recorded Triton launches) run as recorded in
    both the searched runs and the all-reference one, so their error is not
    seen here: `replay run --propagate` holds them to the recording.

    Exit 0 when nothing needs switching, 1 when a set is found, 2 on bad input,
    125 when this code cannot make or build a call.
    """
    device = chosen_device(device)
    from replay.cli.localise_render import print_precision
    from replay.cli.progress import call_progress
    from replay.engine import ReplayOptions
    from replay.engine.precision import bisect_precision, result_json

    options = ReplayOptions(device=device, code_dir=code_dir, providers=frozenset(providers))
    with call_progress(quiet=json_target == "-") as progress:
        result = bisect_precision(snapshot, options, by=by, journal=journal, use_journal=not fresh,
                                  progress=(lambda done, switched, fixed: progress(done, None, SimpleNamespace(
                                      index=f"set {done}:", op=f"{len(switched)} calls switched")))
                                  if progress else None)

    if html_path is not None:
        from replay.engine.html import precision_page
        write_page(html_path, precision_page(result))

    def show(console: Console) -> None:
        print_precision(console, result)

    finish(json_target, result_json(result), show,
           EXIT_PASS if result.minimal is None else EXIT_DIVERGED)
