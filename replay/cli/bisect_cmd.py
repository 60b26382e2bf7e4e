"""`replay bisect`: parses options, shows progress, prints the answer; the work is replay.bisect's."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.text import Text

from replay.cli.common import SafeConsole, SnapshotLocation, finish, json_option
from replay.cli.ray_options import executor_options
from replay.errors import EXIT_INTERRUPTED


@click.command("bisect")
@click.argument("snapshot", required=False, type=SnapshotLocation())
@click.option("--good", required=True, metavar="REF", help="A commit where the probe passes (tag, branch, sha).")
@click.option("--bad", required=True, metavar="REF", help="A later commit where it fails.")
@click.option("--repo", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="The git repository whose history is bisected.")
@click.option("--run", "run", metavar="CMD",
              help="Shell command run inside each probed commit's worktree instead of `replay run` "
                   "(exit 0 good, 1 bad, 125 skip); $REPLAY_SNAPSHOT and $REPLAY_BISECT_COMMIT are set.")
@click.option("--jobs", "-j", type=click.IntRange(1), default=1, show_default=True, metavar="K",
              help="Probe K commits per round in parallel (K+1-section); with several GPUs each probe gets its own.")
@click.option("--first-parent", is_flag=True, help="Follow only first parents: a merged branch is judged by its merge.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), metavar="S",
              help="Seconds a probe may run; past that the commit is skipped.")
@click.option("--no-cache", "no_cache", is_flag=True,
              help="Probe every commit again instead of reusing results kept in .git/replay-bisect-cache.json.")
@click.option("--oracle", type=click.Choice(["auto", "reference", "good-end", "recorded"]), default="auto",
              show_default=True,
              help="What each commit is held to. reference: each variant against the op's reference, single against "
                   "batched, the contracts; good-end: the good end's own outputs on the recorded inputs, bit for bit; "
                   "recorded: the snapshot's recorded outputs, bit for bit (a snapshot recorded at the good end); "
                   "auto: reference, or good-end where both ends pass the reference checks.")
@click.option("--provider", "providers", multiple=True, metavar="MOD",
              help="Trust provider module MOD in every probe's `replay run` (repeatable; see replay run --help). "
                   "Modules in the probed worktree are trusted already.")
@executor_options
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write every step (probes, verdicts, output tails) to FILE.")
@json_option
def command(snapshot: Path | None, good: str, bad: str, repo: Path, run: str | None, jobs: int, first_parent: bool,
            timeout: float | None, no_cache: bool, oracle: str, providers: tuple[str, ...], executor: str,
            ray_address: str | None, ship: str, log_path: Path | None, json_target: str | None) -> None:
    """Find the first commit between --good and --bad where SNAPSHOT stops
    replaying cleanly, or where `--run CMD` starts failing.

    Each probed commit is checked out in a temporary detached git worktree; your
    working tree, index, HEAD and stash are never touched, even on Ctrl-C.
    SNAPSHOT is read from where it is now, so today's recording tests last
    month's kernels, with this installation's `replay run --code WORKTREE`.
    Record it where you saw the bug: its recorded outputs are not the oracle
    (see --oracle). Both ends are probed first. A commit where a recorded call
    cannot be made (its op gone, its arguments no longer taken) is skipped.
    Results are cached per commit, snapshot and command, so a rerun or a wider
    range re-tests nothing. Probes that exit with anything but 0, 1 or 125, or
    time out, are skipped with the reason shown.

    \b
    Examples:
      replay bisect --good v1.2 --bad HEAD snapshots/prefill_001
      replay bisect --good v1.2 --bad HEAD snapshots/bad_run --oracle good-end   # any change of bits
      replay bisect --good v1.2 --bad main snapshots/prefill_001 --jobs 4 --timeout 600
      replay bisect --good v1.2 --bad HEAD --run 'pytest -x tests/test_prefill.py'
      replay bisect --good v1.2 --bad HEAD --first-parent --json - snapshots/prefill_001 > answer.json
      replay bisect --good v1.2 --bad HEAD snapshots/prefill_001 --jobs 8 --executor ray --ray-address HOST:6379

    Exit 0 with an answer (even an ambiguous one), 2 on bad input or when --good
    fails or --bad passes, 130 when interrupted.
    """
    from replay.bisect import BisectOptions, Step, StepLog, fan_out, run_bisect  # gitpython: only here
    from replay.cli.bisect_render import render

    options = BisectOptions(good=good, bad=bad, snapshot=snapshot, repo=repo, run=run, jobs=jobs,
                            first_parent=first_parent, timeout=timeout, reuse_cache=not no_cache,
                            providers=providers, oracle=oracle, executor=executor, ray_address=ray_address, ship=ship)
    quiet = json_target == "-" or not sys.stderr.isatty()
    progress = SafeConsole(stderr=True, highlight=False)
    log = StepLog(log_path) if log_path else None

    def show(step: Step) -> None:
        progress.print(Text.assemble((f"{step.kind:>7} ", "dim"), step.message))

    try:
        result = run_bisect(options, fan_out(None if quiet else show, log))
    except KeyboardInterrupt:
        print("replay: interrupted; worktrees removed, your repository is as it was", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if log:
            log.close()
    finish(json_target, result.to_json(), lambda console: console.print(render(result)), 0)
