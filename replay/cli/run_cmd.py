"""`replay run`: replay a snapshot against every variant, the reference, or golden outputs."""
from __future__ import annotations

from pathlib import Path

import click

from replay.cli.common import ToleranceValue, chosen_device, device_option, finish, json_option, warn
from replay.errors import EXIT_DIVERGED, EXIT_PASS, EXIT_UNTESTABLE


@click.command("run")
@click.argument("snapshot", type=click.Path(path_type=Path))
@click.option("--golden-data", "golden", is_flag=False, flag_value="", default=None, metavar="[DIR]",
              help="Compare the recorded variant's rerun with the recorded outputs (or those of snapshot DIR), "
                   "bitwise unless --atol/--rtol are given.")
@click.option("--atol", type=ToleranceValue(), help="Absolute tolerance for --golden-data (default: bitwise).")
@click.option("--rtol", type=ToleranceValue(), help="Relative tolerance for --golden-data (default: bitwise).")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="Run each variant N times; any bit difference between runs is reported as nondeterminism.")
@click.option("--op", "ops", multiple=True, help="Only calls of this op (repeatable).")
@click.option("--call", "calls", type=int, multiple=True, help="Only this call index (repeatable).")
@click.option("--variant", "variants", multiple=True, help="Only this variant (repeatable); the reference still runs.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first diverging call.")
@device_option
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Import the snapshot's kernel providers from DIR first (another commit's checkout); "
                   "modules in DIR are trusted.")
@click.option("--provider", "providers", multiple=True, metavar="MOD",
              help="Trust module or package MOD as a provider the snapshot may name (repeatable). Without it only "
                   "packages declaring a 'replay.providers' entry point, and --code DIR, are imported.")
@click.option("-v", "--verbose", is_flag=True, help="List every call, not just the failing ones, for long runs.")
@json_option
def command(snapshot: Path, golden: str | None, atol: float | None, rtol: float | None, repeat: int,
            ops: tuple[str, ...], calls: tuple[int, ...], variants: tuple[str, ...], fail_fast: bool,
            device: str | None, code_dir: Path | None, providers: tuple[str, ...], verbose: bool,
            json_target: str | None) -> None:
    """Replay SNAPSHOT: re-run every recorded call against each variant of its op
    (batched on the recorded batch, single row by row, and the reference) and
    name the first call, variant, rows and tag that diverge.

    \b
    Examples:
      replay run snapshots/prefill_001
      replay run snapshots/prefill_001 --op kv_scatter --json -
      replay run snapshots/prefill_001 --golden-data          # after editing a kernel
      replay run snapshots/prefill_001 --repeat 5             # hunt a race
      replay run downloaded/snap --provider my_kernels        # trust the package it names

    A snapshot names the module providing each op; only trusted ones are imported:
    packages declaring a 'replay.providers' entry point, --provider MOD, --code DIR.

    Exit 0 when every check passes, 1 on a divergence, 2 on bad input (an untrusted
    provider too), 125 when the kernels cannot be imported or built, 130 interrupted.
    """
    device = chosen_device(device)
    from replay.engine import ReplayOptions, replay_snapshot
    from replay.cli.progress import call_progress

    options = ReplayOptions(
        device=device, code_dir=code_dir,
        ops=frozenset(ops) or None, calls=frozenset(calls) or None, variants=frozenset(variants) or None,
        golden=golden is not None, golden_dir=Path(golden) if golden else None,
        atol=atol, rtol=rtol, repeat=repeat, fail_fast=fail_fast, providers=frozenset(providers))
    if (atol is not None or rtol is not None) and golden is None:
        raise click.BadParameter("only applies with --golden-data", param_hint="--atol/--rtol")
    with call_progress(quiet=json_target == "-") as progress:
        report = replay_snapshot(snapshot, options, progress)
    for warning in report.warnings:
        warn(warning)
    from replay.cli.render import print_run_report

    finish(json_target, report.to_json(), lambda console: print_run_report(console, report, verbose),
           EXIT_UNTESTABLE if report.untestable else EXIT_PASS if report.passed else EXIT_DIVERGED)
