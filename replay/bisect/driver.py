"""`replay bisect` end to end: validate, verify both ends, search in rounds, describe the answer."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import git

from replay.bisect import interrupts
from replay.bisect.cache import CACHE_NAME, ProbeCache, snapshot_digest
from replay.errors import BisectError
from replay.bisect.history import describe_commit, first_parent, load_range, open_repo, resolve_commit
from replay.bisect.oracle import Oracle, choose
from replay.bisect.parallel import Prober
from replay.bisect.result import BisectResult
from replay.bisect.search import BisectSearch, CommitGraph
from replay.bisect.steps import Step, StepHandler
from replay.bisect.worktrees import remove_stale
from replay.ray_cluster import EXECUTORS, SHIP_CHOICES
from replay.ranks.layout import is_multi_rank, snapshot_members
from replay.snapshot import Snapshot
from replay.snapshot.writer import MANIFEST


@dataclass(frozen=True)
class BisectOptions:
    good: str
    bad: str
    snapshot: Path | None = None  # replayed by the engine, or handed to `run` as $REPLAY_SNAPSHOT
    repo: Path = Path(".")
    run: str | None = None  # a shell line run in each worktree instead of the engine
    jobs: int = 1
    first_parent: bool = False
    timeout: float | None = None  # seconds per probe; past it the commit is skipped
    reuse_cache: bool = True  # False probes every commit again (results are still stored)
    providers: tuple[str, ...] = ()  # provider modules the user trusts, passed on to each `replay run`
    oracle: str = "auto"  # what a commit is held to (replay/bisect/oracle.py): auto, reference, good-end, recorded
    executor: str = "local"  # where probes run: local child processes, or ray tasks (the rounds are the same)
    ray_address: str | None = None  # the Ray cluster to use; None: the one connected, else a local Ray
    ship: str = "auto"  # how Ray workers get their files: shared, ray (object store), auto (replay/ray_cluster.py)


def run_bisect(options: BisectOptions, on_step: StepHandler | None = None) -> BisectResult:
    """Find the first commit between options.good and options.bad whose probe fails.

    Raises BisectError (exit 2) on bad input or when a probe contradicts --good or
    --bad, KeyboardInterrupt on Ctrl-C or SIGTERM; worktrees are gone either way.
    """
    with interrupts.interruptible():  # from the start: no Ctrl-C cuts a worktree's add or remove in two
        return _run(options, _one_at_a_time(on_step))


def _run(options: BisectOptions, emit: StepHandler) -> BisectResult:
    started = time.monotonic()
    if options.jobs < 1:
        raise BisectError(f"--jobs {options.jobs}: needs at least 1")
    if options.executor not in EXECUTORS:
        raise BisectError(f"--executor {options.executor}: one of {', '.join(EXECUTORS)}")
    if options.ship not in SHIP_CHOICES:
        raise BisectError(f"--ship {options.ship}: one of {', '.join(SHIP_CHOICES)}")
    repo = open_repo(options.repo)
    good = resolve_commit(repo, options.good, "--good")
    bad = resolve_commit(repo, options.bad, "--bad")
    snapshot = _resolve_snapshot(options.snapshot)
    if options.run is None and snapshot is None:
        raise BisectError("nothing to probe with: give a SNAPSHOT to replay, or --run CMD")
    graph = load_range(repo, good, bad, options.first_parent)
    for path in remove_stale(repo):
        emit(Step("prune", f"removed worktree {path}, left behind by a killed run"))
    cache = ProbeCache(Path(repo.common_dir) / CACHE_NAME, snapshot_digest(snapshot))
    rounds_needed = math.ceil(math.log(len(graph)) / math.log(options.jobs + 1) - 1e-9)
    probe = f"`{options.run}`" if options.run is not None else f"replay run {snapshot}"
    emit(Step("start", f"bisecting {len(graph)} commits after {good[:10]} (good) up to {bad[:10]} (bad) "
                       f"with {probe}, {options.jobs} at a time: about {rounds_needed} rounds",
              data={"good": good, "bad": bad, "range_size": len(graph), "jobs": options.jobs}))
    prober = None
    try:
        with interrupts.deferred():  # a Prober made is a Prober closed: it owns a temporary root
            prober = Prober(repo, cache, emit, options.jobs, options.timeout, options.reuse_cache,
                            options.executor, options.ray_address, options.ship)
        damage = _damage(options, snapshot, emit)
        flags = tuple(arg for p in options.providers for arg in ("--provider", p)) + (("--readable",) if damage else ())
        oracle = choose(options.oracle, prober, snapshot, flags, options.run, good, bad, emit)
        result = _bisect(repo, graph, good, bad, prober, oracle, options.jobs, emit, started)
        result.warnings[:0] = damage
        return result
    finally:
        if prober is not None:
            with interrupts.deferred():
                prober.close()


def _one_at_a_time(on_step: StepHandler | None) -> StepHandler:
    """Probes report from worker threads: handlers never run two at a time."""
    lock = threading.Lock()

    def emit(step: Step) -> None:
        if on_step is not None:
            with lock:
                on_step(step)
    return emit


def _damage(options: BisectOptions, snapshot: Path | None, emit: StepHandler) -> list[str]:
    """What of the snapshot cannot be read (a cut last index line: a recording killed mid-write),
    said once here: the probes then replay the calls that can be read (`replay run --readable`)."""
    members = [] if snapshot is None or options.run is not None else snapshot_members(snapshot).values()
    problems = [problem for member in members for problem in Snapshot(member, strict=False).problems]
    said = [f"{problem}; the probes replay the calls that can be read" for problem in problems]
    for line in said:
        emit(Step("warning", line))
    return said


def _resolve_snapshot(snapshot: Path | None) -> Path | None:
    """An absolute path, read from where it stands now, not from each probed commit."""
    if snapshot is None:
        return None
    path = Path(snapshot).expanduser().resolve()
    if not path.exists():
        raise BisectError(f"snapshot not found: {snapshot}")
    if not (path / MANIFEST).is_file() and not is_multi_rank(path):
        raise BisectError(f"not a snapshot (no {MANIFEST}) nor a multi-rank recording (no rank-<r>/): {snapshot}")
    return path


def _bisect(repo: git.Repo, graph: CommitGraph, good: str, bad: str, prober: Prober, oracle: Oracle, jobs: int,
            emit: StepHandler, started: float) -> BisectResult:
    search, rounds = _search(graph, prober, oracle, jobs, emit)
    warnings = [f"{graph.shas[g][:10]} tested good although it descends from {graph.shas[b][:10]}, "
                f"which tested bad: the test is not monotone here" for g, b in search.contradictions()]
    for warning in warnings:
        emit(Step("warning", warning))
    outcome = search.outcome()
    candidates = [describe_commit(repo, graph.shas[i]) for i in outcome.candidates]
    first_bad = candidates[0] if outcome.first_bad is not None else None
    first_bad_probe = parent_probe = None
    if first_bad is not None:
        first_bad_probe = prober.record_for(first_bad.sha, oracle.command)
        parent = first_parent(repo, first_bad.sha)
        if parent is not None:
            parent_probe = (prober.record_for(parent, oracle.command)
                            or prober.probe([parent], "parent", rounds, oracle.command)[parent])
        emit(Step("done", f"first bad commit {first_bad.short} {first_bad.subject}"))
    else:
        emit(Step("done", f"skipped commits leave {len(candidates)} candidates: "
                          + " ".join(c.short for c in candidates)))
    return BisectResult(good=good, bad=bad, command=oracle.command.label, oracle=oracle.name,
                        oracle_note=oracle.note, range_size=len(graph),
                        first_bad=first_bad, candidates=candidates, first_bad_probe=first_bad_probe,
                        parent_probe=parent_probe, probes=prober.records, rounds=rounds,
                        seconds=time.monotonic() - started, warnings=warnings)


def _search(graph: CommitGraph, prober: Prober, oracle: Oracle, jobs: int,
            emit: StepHandler) -> tuple[BisectSearch, int]:
    """Narrow the range with what the cache knows, then in rounds of `jobs` probes; return the rounds."""
    search = BisectSearch(graph)
    index = {sha: i for i, sha in enumerate(graph.shas)}
    known = [sha for sha in graph.shas[:-1] if prober.cached(sha, oracle.command)]  # the tip is bad already
    for sha, record in prober.probe(known, "search", 0, oracle.command).items():
        search.record(index[sha], record.outcome.verdict)
    if known:
        emit(Step("cache", f"{len(known)} commits in the range were tested before; "
                           f"{search.remaining()} may still be first bad"))
    rounds = 0
    while batch := search.next_batch(jobs):
        rounds += 1
        for sha, record in prober.probe([graph.shas[i] for i in batch], "search", rounds, oracle.command).items():
            search.record(index[sha], record.outcome.verdict)
        emit(Step("round", f"{rounds}: {search.remaining()} commit(s) may be first bad",
                  data={"round": rounds, "remaining": search.remaining()}))
    return search, rounds
