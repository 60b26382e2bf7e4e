"""`replay run` on a multi-rank recording: each rank's kernel calls replayed alone, then its
collectives checked across ranks."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from replay.engine.report import CallReport, RunReport
from replay.engine.session import ProgressFn, ReplayOptions, replay_snapshot
from replay.ranks.collective_check import CollectiveCheck, check_collectives
from replay.ranks.layout import is_multi_rank, rank_path, rank_set

RankProgress = Callable[[int, int, int, CallReport], None]  # rank, done, total, the call's report
Replayer = Callable[[Path, ReplayOptions, ProgressFn | None], RunReport]  # replay_snapshot, or one on Ray


@dataclass
class RanksReport:
    parent: str
    world_size: int
    ranks: dict[int, RunReport] = field(default_factory=dict)
    collectives: list[CollectiveCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # ranks missing, what a rank could not read

    @property
    def passed(self) -> bool:
        """Every rank's calls pass and every collective was checked and holds."""
        return all(r.passed for r in self.ranks.values()) and all(c.passed and c.untested is None
                                                                  for c in self.collectives)

    @property
    def untestable(self) -> str | None:
        return next((f"rank {rank}: {r.untestable}" for rank, r in self.ranks.items() if r.untestable), None)

    def first_divergence(self) -> dict[str, Any] | None:
        """The earliest failing call of the lowest rank with one, else the first collective whose
        result a rank does not hold."""
        for rank, report in self.ranks.items():
            summary = report.summary()
            if summary is not None:
                return {"rank": rank, **summary}
        for check in self.collectives:
            if check.untested is not None:
                first = min(check.calls, default=None)
                return {"rank": first, "call": check.calls.get(first) if first is not None else None,
                        "op": f"torch.distributed.{check.kind}", "collective_ordinal": check.ordinal,
                        "tensor": None, "description": f"not checked: {check.untested}"}
            if check.failures:
                failure = check.failures[0]
                return {"rank": failure["rank"], "call": check.calls.get(failure["rank"]),
                        "op": f"torch.distributed.{check.kind}", "collective_ordinal": check.ordinal,
                        "tensor": failure["tensor"], "description": failure["problem"]}
        return None

    def to_json(self) -> dict[str, Any]:
        """As a RunReport's, with each call's rank: `calls` holds every rank's (a bisect reads them as a
        run's), `ranks` each rank's summary."""
        ranks = {rank: report.to_json() for rank, report in self.ranks.items()}
        return {"snapshot": self.parent, "world_size": self.world_size, "passed": self.passed,
                "untestable": self.untestable, "problems": self.problems,
                "first_divergence": self.first_divergence(),
                "collectives_checked": sum(c.untested is None and c.uncheckable is None for c in self.collectives),
                "collectives_failed": sum(not c.passed for c in self.collectives),
                "ranks": {str(rank): {k: v for k, v in data.items() if k != "calls"} for rank, data in ranks.items()},
                "calls": [{**call, "rank": rank} for rank, data in ranks.items() for call in data["calls"]],
                "collectives": [c.to_json() for c in self.collectives]}


def replay_ranks(parent: str | Path, options: ReplayOptions, progress: RankProgress | None = None,
                 replay: Replayer = replay_snapshot) -> RanksReport:
    """Replay every rank of the multi-rank recording at `parent` (ranks in order, each as `replay`
    replays a snapshot: here, or fanned out on Ray) and check its collectives across ranks."""
    ranks = rank_set(parent)
    report = RanksReport(str(parent), ranks.world_size, problems=list(ranks.problems))
    for rank, path in ranks.ranks.items():
        told = (lambda done, total, call, rank=rank: progress(rank, done, total, call)) if progress else None
        result = replay(path, _for_rank(options, rank), told)
        report.problems += [f"rank {rank}: {problem}" for problem in result.problems]
        report.ranks[rank] = result
        if options.fail_fast and not result.passed:
            return report
    report.collectives = check_collectives(ranks)
    return report


def _for_rank(options: ReplayOptions, rank: int) -> ReplayOptions:
    """A rank's options: its outputs saved into, and its golden data read from, the rank-<r>/ of the
    directories given (multi-rank too: bisect's good-end oracle saves a rank's outputs and compares)."""
    golden = options.golden_dir
    return dataclasses.replace(
        options, collectives_elsewhere=True,
        save_outputs=rank_path(options.save_outputs, rank) if options.save_outputs else None,
        golden_dir=rank_path(golden, rank) if golden is not None and is_multi_rank(golden) else golden)
