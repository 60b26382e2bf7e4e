"""`replay run --executor ray`: a snapshot's selected calls split into contiguous shards, each replayed
by `replay_snapshot` in a Ray task, the reports merged in call order.

Calls are independent when replayed (each from its recorded inputs), so a shard's verdicts are the
ones a whole run gives; what only a whole run can do (--save-outputs writes one snapshot,
--propagate follows the chain across calls) is refused by the CLI. The folders a worker reads (the
snapshot, --code DIR, --golden-data DIR) are read where they are or shipped (replay/ray_cluster.py).
Reports come back pickled between our own processes; nothing read from a snapshot is unpickled.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from replay import ray_cluster
from replay.engine.report import CallReport, RunReport
from replay.engine.session import (TOLERANCE_UNUSED, ProgressFn, ReplayOptions, collectives_not_replayed,
                                   replay_snapshot)
from replay.errors import ReplayError
from replay.ranks.recording import is_collective_op
from replay.ranks.run import RankProgress, RanksReport, replay_ranks
from replay.snapshot import Snapshot

Folder = Path | ray_cluster.ShippedTree  # a path every worker reads, or a folder shipped through Ray


@dataclass(frozen=True)
class RayPlan:
    """Where shards run: `jobs` of them (None: as many as the cluster runs at once), on the Ray at
    `address` (None: a local one), folders per `ship`."""

    jobs: int | None = None
    address: str | None = None
    ship: str = "auto"


@dataclass(frozen=True)
class ShardJob:
    snapshot: Folder
    options: ReplayOptions  # its calls: the shard's
    code_dir: Folder | None
    golden_dir: Folder | None

    def of(self, calls: list[int]) -> ShardJob:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, calls=frozenset(calls)))


def replay_shard(job: ShardJob) -> RunReport:
    """On a worker: the shard replayed from its folders, wherever they are here."""
    options = dataclasses.replace(job.options, code_dir=_here(job.code_dir), golden_dir=_here(job.golden_dir))
    snapshot = _here(job.snapshot)
    assert snapshot is not None
    return replay_snapshot(snapshot, options)


def _here(folder: Folder | None) -> Path | None:
    return ray_cluster.unpacked(folder) if isinstance(folder, ray_cluster.ShippedTree) else folder


def shards(indices: list[int], count: int) -> list[list[int]]:
    """`indices` in `count` contiguous runs (fewer where there are fewer calls), sizes differing by at most one."""
    count = max(1, min(count, len(indices)))
    size, extra = divmod(len(indices), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [indices[start:end] for start, end in zip(bounds, bounds[1:])]


def replay_on_ray(path: Path, options: ReplayOptions, plan: RayPlan, progress: ProgressFn | None = None) -> RunReport:
    """`replay_snapshot(path, options)`, its calls replayed in `plan.jobs` Ray tasks, one GPU (else one CPU) each.

    Progress comes a shard at a time. A shard whose worker dies twice becomes a problem naming its
    calls (exit 2): never a pass or a divergence.
    """
    started = time.perf_counter()
    snapshot = Snapshot(path, strict=False)
    chosen = [e for e in snapshot.entries if (options.ops is None or e.op in options.ops)
              and (options.calls is None or e.index in options.calls)]
    selected = [e.index for e in chosen if not is_collective_op(e.op)]  # what the shards replay
    collectives = len(chosen) - len(selected)  # not replayed on one rank: said once here, not a shard at a time
    if not selected:  # nothing to split: the engine says why (no calls match, nothing readable)
        return replay_snapshot(path, options, progress)
    with ray_cluster.connected(plan.address, plan.jobs or os.cpu_count() or 1) as ray:
        shipment = ray_cluster.Shipment()
        ship = ray_cluster.chosen_ship(plan.ship)
        refs: list[Any] = []
        try:
            shard_options = dataclasses.replace(options, collectives_elsewhere=True)
            base = ShardJob(_placed(Path(path), ship, shipment), shard_options,
                            _placed(options.code_dir, ship, shipment) if options.code_dir else None,
                            _placed(options.golden_dir, ship, shipment) if options.golden_dir else None)
            task = ray.remote(max_retries=ray_cluster.MAX_RETRIES, max_calls=1,  # a fresh process a shard: no module of
                              **ray_cluster.task_resources())(replay_shard)  # another run's code stays imported
            count = plan.jobs or ray_cluster.task_slots()
            pending = {task.remote(base.of(shard)): shard for shard in shards(selected, count)}
            refs = list(pending)
            reports, lost = _gather(ray, pending, len(selected), progress)
        except BaseException:  # Ctrl-C, or a shard's bad input: no shard left running
            ray_cluster.cancel_all(refs)
            raise
        finally:
            shipment.close()
    merged = merge(str(path), reports, options)
    merged.problems += lost
    if collectives and not options.collectives_elsewhere:
        merged.warnings.append(collectives_not_replayed(path, collectives))
    merged.total_seconds = time.perf_counter() - started  # wall time: the shards ran side by side
    return merged


def replay_ranks_on_ray(parent: Path, options: ReplayOptions, plan: RayPlan,
                       progress: RankProgress | None = None) -> RanksReport:
    """A multi-rank recording's ranks replayed one after another, each rank's calls fanned out on one
    Ray connection; its collectives checked here, across ranks."""
    with ray_cluster.connected(plan.address, plan.jobs or os.cpu_count() or 1):  # the ranks' replays reuse it
        return replay_ranks(parent, options, progress,
                            lambda path, rank_options, told: replay_on_ray(path, rank_options, plan, told))


def _placed(where: Path, ship: str, shipment: ray_cluster.Shipment) -> Folder:
    """Where workers read `where`: its absolute path (a worker starts elsewhere), or a shipped copy."""
    return shipment.tree(where.resolve()) if ship == "ray" else where.resolve()


def _gather(ray: Any, pending: dict[Any, list[int]], total: int,
            progress: ProgressFn | None) -> tuple[list[RunReport], list[str]]:
    """Each shard's report as it finishes (its calls told to `progress`), and what was lost."""
    reports: list[RunReport] = []
    lost: list[str] = []
    done = 0
    waiting = list(pending)
    while waiting:
        finished, waiting = ray.wait(waiting, num_returns=1)
        ref = finished[0]
        try:
            report = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # raised by our code on the worker
            if isinstance(exc.cause, ReplayError):  # bad input: its one line, as a run here says it
                raise exc.cause from None
            raise
        except ray.exceptions.RayError as exc:
            calls = pending[ref]
            lost.append(f"calls {calls[0]}..{calls[-1]} were not replayed: Ray worker lost "
                        f"({type(exc).__name__} after {ray_cluster.MAX_RETRIES + 1} tries)")
            continue
        reports.append(report)
        for call in report.calls:
            done += 1
            if progress:
                progress(done, total, call)
    return reports, lost


def merge(snapshot: str, reports: list[RunReport], options: ReplayOptions) -> RunReport:
    """One report as a whole run gives it: calls in index order, up to the first that stops a run
    (an untestable call, or with --fail-fast a failing one); warnings and problems said once."""
    first = reports[0] if reports else RunReport(snapshot, options.device, "golden" if options.golden else "variants")
    merged = RunReport(snapshot, first.device, first.mode)
    calls = sorted((call for report in reports for call in report.calls), key=lambda call: call.index)
    merged.calls = calls[:_stop(calls, options) + 1]
    merged.load_seconds = sum(report.load_seconds for report in reports)
    # a run's warnings said once; that the tolerance went unused, only where no shard used it
    merged.warnings = [w for w in _once(w for report in reports for w in report.warnings)
                       if w != TOLERANCE_UNUSED or all(w in report.warnings for report in reports)]
    merged.problems = _once(p for report in reports for p in report.problems)
    return merged


def _stop(calls: list[CallReport], options: ReplayOptions) -> int:
    """The position of the call a whole run would have stopped at, else the last."""
    return next((i for i, call in enumerate(calls) if call.untestable or (options.fail_fast and not call.passed)),
                len(calls) - 1)


def _once(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
