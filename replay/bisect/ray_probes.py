"""Bisect probes as Ray tasks: the same probe command, run by a worker of a Ray cluster.

With `--ship shared` the worktree is made here, as for a local probe, and the task runs the probe
in it: every worker sees this machine's paths (a local Ray, or a temporary directory on a mount all
nodes share: TMPDIR). With `--ship ray` no path of this machine is used there: the commit's tree
(`git archive`) goes with the task, the snapshot and any --golden-data folder through the object
store once (replay/ray_cluster.py), and what the probe keeps (--save-outputs) comes back with its
outcome. A `--run` line then sees the commit's files but no git repository.

A task whose worker dies is run again by Ray (ray_cluster.MAX_RETRIES); one that still does not finish is
a skip, "untested", never cached and never good or bad.
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git

from replay import ray_cluster
from replay.bisect.probe import ProbeCommand, ProbeOutcome, ProbeRunner
from replay.bisect.search import SKIP
from replay.bisect.steps import Step, StepHandler
from replay.bisect.worktrees import Worktrees

CANCEL_CHECK_SECONDS = 0.2
GOLDEN_DATA, SAVE_OUTPUTS = "--golden-data", "--save-outputs"  # the oracle's options that name folders


@dataclass(frozen=True)
class ProbeJob:
    """What a task needs to run one probe."""

    command: ProbeCommand
    sha: str
    timeout: float | None
    worktree: Path | None = None  # shared: the driver's worktree and neutral directory
    neutral_dir: Path | None = None
    inputs: dict[str, ray_cluster.ShippedTree] = field(default_factory=dict)  # shipped: folders, by driver path
    outputs: tuple[str, ...] = ()  # shipped: folders the probe writes, by driver path, sent back


def run_probe(job: ProbeJob, tree: bytes | None) -> tuple[ProbeOutcome, dict[str, bytes]]:
    """On a worker: the probe in the driver's worktree, or in `tree` (a `git archive` tar) unpacked
    here; with the folders it wrote that the driver wants back, packed."""
    with tempfile.TemporaryDirectory(prefix="replay-probe-") as scratch_dir:
        scratch = Path(scratch_dir)
        places = {path: str(ray_cluster.unpacked(shipped)) for path, shipped in job.inputs.items()}
        places.update({path: str(scratch / f"output-{i}") for i, path in enumerate(job.outputs)})
        worktree, neutral_dir = job.worktree, job.neutral_dir
        if tree is not None:
            worktree, neutral_dir = scratch / "tree", scratch / "cwd"
            ray_cluster.unpack(tree, worktree)
            neutral_dir.mkdir()
        assert worktree is not None and neutral_dir is not None
        runner = ProbeRunner(job.timeout, neutral_dir)
        outcome = _interruptible(runner, _relocated(job.command, places), worktree, job.sha)
        written = [path for path in job.outputs if Path(places[path]).is_dir()]
        return outcome, {path: ray_cluster.pack_directory(Path(places[path])) for path in written}


def _interruptible(runner: ProbeRunner, command: ProbeCommand, worktree: Path, sha: str) -> ProbeOutcome:
    """The probe, waited for in short steps: Ray cancels a task by raising KeyboardInterrupt in it, which
    comes only while it runs Python, never while it waits on its child. Cancelled, it kills the probe."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        probe = pool.submit(runner.run, command, worktree, sha)
        try:
            while True:
                with contextlib.suppress(futures.TimeoutError):
                    return probe.result(timeout=CANCEL_CHECK_SECONDS)
        finally:
            runner.cancel()  # the probe's whole process tree, where it still runs


def _relocated(command: ProbeCommand, places: dict[str, str]) -> ProbeCommand:
    """`command` with the driver's paths swapped for this worker's copies (the label and cache identity stay)."""
    if not places:
        return command
    snapshot = Path(places.get(str(command.snapshot), str(command.snapshot))) if command.snapshot else None
    return dataclasses.replace(command, snapshot=snapshot, options=tuple(places.get(a, a) for a in command.options),
                               oracle=tuple(places.get(a, a) for a in command.oracle))


def folders_to_ship(command: ProbeCommand) -> tuple[list[str], list[str]]:
    """(the folders the probe reads, the folders it writes), as the driver names them."""
    reads = [str(command.snapshot)] if command.snapshot is not None else []
    writes = []
    for option, value in zip(command.oracle, command.oracle[1:]):
        if option == GOLDEN_DATA and not value.startswith("-"):  # `--golden-data` alone: the snapshot's own
            reads.append(value)
        elif option == SAVE_OUTPUTS:
            writes.append(value)
    return reads, writes


class RayProbes:
    """Each probe a Ray task (one GPU, else one CPU); the Ray session lasts until close()."""

    def __init__(self, repo: git.Repo, worktrees: Worktrees, timeout: float | None, jobs: int,
                 address: str | None, ship: str, emit: StepHandler) -> None:
        self._repo = repo
        self._worktrees = worktrees
        self._timeout = timeout
        self._session = contextlib.ExitStack()
        self._live: set[Any] = set()  # refs of tasks not yet answered
        self._lock = threading.Lock()
        self._cancelled = False
        try:
            self._ray = self._session.enter_context(ray_cluster.connected(address, jobs))
            self._ship = ray_cluster.chosen_ship(ship)
            self._shipment = ray_cluster.Shipment()
            self._session.callback(self._shipment.close)  # before Ray is left
            self._task = self._ray.remote(max_retries=ray_cluster.MAX_RETRIES,
                                          **ray_cluster.task_resources())(run_probe)
        except BaseException:
            self._session.close()
            raise
        how = "the worktrees made here" if self._ship == "shared" else "each commit's tree shipped through Ray"
        emit(Step("ray", f"probes run as Ray tasks on {ray_cluster.describe_cluster()}, "
                         f"in {how} (--ship {self._ship})"))

    def run(self, command: ProbeCommand, sha: str, device: str | None) -> ProbeOutcome:
        """The probe of `sha` on a worker; `device` is Ray's to choose."""
        if self._ship == "shared":
            with self._worktrees.checkout(sha) as worktree:
                job = ProbeJob(command, sha, self._timeout, worktree, self._worktrees.neutral_dir)
                return self._answer(job, None)
        reads, writes = folders_to_ship(command)
        job = ProbeJob(command, sha, self._timeout, inputs={path: self._shipment.tree(Path(path)) for path in reads},
                       outputs=tuple(writes))
        tree = self._repo.git.archive("--format=tar", sha, stdout_as_string=False)
        return self._answer(job, tree)

    def _answer(self, job: ProbeJob, tree: bytes | None) -> ProbeOutcome:
        """The task's outcome, its folders put where the driver named them; a skip where Ray lost it."""
        exceptions = self._ray.exceptions
        started = time.monotonic()
        with self._lock:
            if self._cancelled:
                return _skipped("cancelled", started)
            ref = self._task.remote(job, tree)
            self._live.add(ref)
        try:
            outcome, written = self._ray.get(ref)
        except exceptions.TaskCancelledError:
            return _skipped("cancelled", started)
        except exceptions.RayTaskError as exc:
            if not isinstance(exc.cause, OSError):  # a bug of ours: said, not hidden as a skip
                raise
            return _skipped(f"untested: the Ray worker could not prepare the probe: {exc.cause}", started)
        except exceptions.RayError as exc:  # the worker or its node died, twice
            tries = ray_cluster.MAX_RETRIES + 1
            return _skipped(f"untested: Ray worker lost ({type(exc).__name__} after {tries} tries)", started)
        finally:
            with self._lock:
                self._live.discard(ref)
        for path, data in written.items():
            ray_cluster.unpack(data, Path(path))
        return outcome

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            live = list(self._live)
        ray_cluster.cancel_all(live)

    def close(self) -> None:
        self._session.close()


def _skipped(reason: str, started: float) -> ProbeOutcome:
    """No verdict and no exit code: never cached (ProbeOutcome.deterministic), never good or bad."""
    return ProbeOutcome(SKIP, None, reason, round(time.monotonic() - started, 3), None, "")
