"""`replay run`: replay a snapshot against every variant, the reference, or golden outputs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click

from rich.console import Console

from replay.cli.common import (MetricValue, SnapshotLocation, ToleranceValue, chosen_device, device_option, error,
                               finish, json_option, metric_help, warn, write_page)
from replay.cli.ray_options import executor_options
from replay.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_PASS, EXIT_UNTESTABLE
from replay.ranks.layout import is_multi_rank


@click.command("run")
@click.argument("snapshot", type=SnapshotLocation())
@click.option("--golden-data", "golden", is_flag=False, flag_value="", default=None, metavar="[DIR]",
              help="Compare the recorded variant's rerun with the recorded outputs (or those of snapshot DIR), "
                   "bitwise unless --atol/--rtol are given.")
@click.option("--atol", type=ToleranceValue(), help="Absolute tolerance against --golden-data, and of a recorded "
              "Triton launch's or torch op's rerun against its recording (default: bitwise).")
@click.option("--rtol", type=ToleranceValue(), help="Relative tolerance, as --atol (default: bitwise).")
@click.option("--metric", type=MetricValue(), help=metric_help() + " Default: each op's declared metric, else "
              "its tolerance.")
@click.option("--oracle", type=click.Choice(["all", "reference"]), default="all", show_default=True,
              help="What the variants answer to: 'all' is the reference, each other, the op's contracts and the "
                   "recorded outputs (within the op's tolerance); 'reference' leaves the recorded outputs out, for a "
                   "snapshot recorded on other code (a bisect across commits does this).")
@click.option("--save-outputs", type=click.Path(path_type=Path), metavar="DIR",
              help="Also write a new snapshot at DIR: the recorded inputs with the outputs and tags this code's rerun "
                   "of each recorded variant made, to compare against later with --golden-data DIR.")
@click.option("--readable", is_flag=True,
              help="Replay the calls that can be read and warn of what cannot (a cut index line, a corrupt call "
                   "file), exiting as those calls do; without it, damage is bad input (exit 2) once they are reported.")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="Run each variant N times; any bit difference between runs is reported as nondeterminism.")
@click.option("--op", "ops", multiple=True, help="Only calls of this op (repeatable).")
@click.option("--call", "calls", type=int, multiple=True, help="Only this call index (repeatable).")
@click.option("--variant", "variants", multiple=True, help="Only this variant (repeatable); the reference still runs.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first diverging call.")
@click.option("--propagate", is_flag=True,
              help="Replay in dependency order: feed each call what its producers made when replayed (kernels after "
                   "kernels, and references after references), judge each call's own error (kernel against "
                   "reference on the same inputs) and its drift (kernel chain against reference chain), and name "
                   "the first call over its own tolerance apart from the calls that only inherit its error.")
@device_option
@click.option("--code", "code_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Import the snapshot's kernel providers from DIR first (another commit's checkout); "
                   "modules in DIR are trusted.")
@click.option("--provider", "providers", multiple=True, metavar="MOD",
              help="Trust module or package MOD as a provider the snapshot may name (repeatable). Without it only "
                   "packages declaring a 'replay.providers' entry point, and --code DIR, are imported.")
@click.option("--trust-recorded-source", is_flag=True, help="Run kernels generated when recorded (torch.compile's, "
              "whose modules cannot be imported) from the source the snapshot stores. That source is code: "
              "only for snapshots you trust as you trust your own code.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write one self-contained HTML page: verdicts per call and, for each failing tensor, a "
                   "heatmap of its difference, the rows that differ, both sides' values and a histogram of errors "
                   "(with --propagate, the error of every call along the chain).")
@click.option("-v", "--verbose", is_flag=True, help="List every call, not just the failing ones, for long runs.")
@executor_options
@click.option("--jobs", "-j", type=click.IntRange(1), default=None, metavar="N",
              help="With --executor ray: split the calls into N shards of consecutive calls, each a Ray task "
                   "(default: one a CPU, or a GPU, of the cluster).")
@json_option
def command(snapshot: Path, golden: str | None, atol: float | None, rtol: float | None, metric: Any, oracle: str,
            save_outputs: Path | None, readable: bool, repeat: int,
            ops: tuple[str, ...], calls: tuple[int, ...], variants: tuple[str, ...], fail_fast: bool,
            device: str | None, code_dir: Path | None, providers: tuple[str, ...], trust_recorded_source: bool,
            html_path: Path | None, verbose: bool, propagate: bool, executor: str, ray_address: str | None,
            ship: str, jobs: int | None, json_target: str | None) -> None:
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
      replay run snapshots/bad_run --code . --save-outputs /tmp/before   # keep today's outputs
      replay run snapshots/bad_run --code . --golden-data /tmp/before    # after an edit: what changed
      replay run snap --propagate            # where error starts, and which calls only inherit it
      replay run snap --executor ray --jobs 8 --ray-address HOST:6379   # calls shared among Ray tasks

    A snapshot names the module providing each op; only trusted ones are imported:
    packages declaring a 'replay.providers' entry point, --provider MOD, --code DIR.

    Exit 0 when every check passes, 1 on a divergence, 2 on bad input (an untrusted
    provider, a damaged file: the readable calls are still replayed and reported), 125
    when this code cannot make a recorded call (its module, op or variant is gone, it no
    longer takes the recorded arguments, it does not build), 130 interrupted.
    """
    device = chosen_device(device)
    from replay.engine import ReplayOptions, replay_snapshot
    from replay.cli.progress import call_progress

    options = ReplayOptions(
        device=device, code_dir=code_dir,
        ops=frozenset(ops) or None, calls=frozenset(calls) or None, variants=frozenset(variants) or None,
        golden=golden is not None, golden_dir=Path(golden) if golden else None,
        atol=atol, rtol=rtol, repeat=repeat, fail_fast=fail_fast, providers=frozenset(providers),
        compare_recorded=oracle == "all", save_outputs=save_outputs, readable=readable,
        trust_recorded_source=trust_recorded_source, metric=metric, evidence=html_path is not None)
    if oracle != "all" and golden is not None:
        raise click.BadParameter("--golden-data takes the recorded outputs as the oracle", param_hint="--oracle")
    if executor == "ray":
        _refuse({"save_outputs": save_outputs is not None, "propagate": propagate},  # a whole run's, not a shard's
                "cannot be combined with --executor ray, which replays the calls in separate shards", "--executor")
    elif jobs is not None:
        raise click.BadParameter("splits the calls among Ray tasks: give --executor ray too", param_hint="--jobs")
    if is_multi_rank(snapshot):
        plan = _ray_plan(jobs, ray_address, ship) if executor == "ray" else None
        _refuse({"propagate": propagate, "html": html_path is not None},
                "is not taken with a multi-rank recording: replay one rank's directory (rank-<r>/) for it")
        _run_ranks(snapshot, options, plan, verbose, json_target)
    if propagate:
        # calls, variants and judgements chosen have no meaning along a chain of every call
        _refuse({"golden": golden is not None, "save_outputs": save_outputs is not None, "op": bool(ops),
                 "call": bool(calls), "variant": bool(variants), "repeat": repeat > 1, "metric": metric is not None,
                 "atol": atol is not None, "rtol": rtol is not None, "oracle": oracle != "all"},
                "cannot be combined with --propagate, which replays every call in order, kernel and reference, "
                "within each op's tolerance", "--propagate")
        _run_propagated(snapshot, options, verbose, json_target, html_path)
    with call_progress(quiet=json_target == "-") as progress:
        if executor == "ray":
            from replay.engine.fanout import replay_on_ray
            report = replay_on_ray(snapshot, options, _ray_plan(jobs, ray_address, ship), progress)
        else:
            report = replay_snapshot(snapshot, options, progress)
    if html_path is not None:
        from replay.engine.html import run_page
        write_page(html_path, run_page(report))
    for warning in report.warnings:
        warn(warning)
    from replay.cli.render import print_run_report

    def show(console: Console) -> None:
        print_run_report(console, report, verbose)
        for problem in report.problems:  # after the report, where a reader ends
            error(problem)

    if json_target == "-":  # no report on stdout: the problems still go to stderr
        for problem in report.problems:
            error(problem)
    finish(json_target, report.to_json(), show,
           _exit_code(report))


def _refuse(given: dict[str, bool], why: str, hint: str | None = None) -> None:
    """Options that have no meaning with the mode chosen are refused, not ignored: the first given
    one, `--name ` + `why`, exit 2."""
    for name, on in given.items():
        if on:
            flag = f"--{name.replace('_', '-')}"
            raise click.BadParameter(f"{flag} {why}", param_hint=hint or flag)


def _exit_code(report: Any) -> int:
    """A report's exit: 2 what could not be read, 125 a call this code cannot make, else 0 or 1."""
    return (EXIT_BAD_INPUT if report.problems else EXIT_UNTESTABLE if report.untestable
            else EXIT_PASS if report.passed else EXIT_DIVERGED)


def _run_propagated(snapshot: Path, options: Any, verbose: bool, json_target: str | None,
                    html_path: Path | None) -> None:
    from replay.cli.localise_render import print_propagation
    from replay.cli.progress import call_progress
    from replay.engine.propagate import propagate, report_json

    with call_progress(quiet=json_target == "-") as progress:
        report = propagate(snapshot, options, progress)
    if html_path is not None:
        from replay.engine.html import propagation_page
        write_page(html_path, propagation_page(report))

    def show(console: Console) -> None:
        print_propagation(console, report, verbose)
        for problem in report.problems:
            error(problem)

    finish(json_target, report_json(report), show,
           _exit_code(report))



def _ray_plan(jobs: int | None, ray_address: str | None, ship: str) -> Any:
    from replay.engine.fanout import RayPlan
    return RayPlan(jobs, ray_address, ship)


def _run_ranks(parent: Path, options: Any, plan: Any, verbose: bool, json_target: str | None) -> NoReturn:
    """A multi-rank recording: each rank replayed as a snapshot is (here, or its calls fanned out on Ray
    with `plan`), its collectives checked across ranks."""
    from replay.cli.progress import call_progress
    from replay.cli.ranks_render import print_ranks_report
    from replay.ranks.run import replay_ranks

    with call_progress(quiet=json_target == "-") as progress:
        told = (lambda rank, done, total, call: progress(done, total, call)) if progress is not None else None
        if plan is not None:
            from replay.engine.fanout import replay_ranks_on_ray
            report = replay_ranks_on_ray(parent, options, plan, told)
        else:
            report = replay_ranks(parent, options, told)
    for problem in report.problems:
        error(problem)
    finish(json_target, report.to_json(), lambda console: print_ranks_report(console, report, verbose),
           _exit_code(report))
