"""What a bisect found: every probe's record and the answer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replay.bisect.history import CommitInfo
from replay.bisect.probe import ProbeOutcome


@dataclass(frozen=True)
class ProbeRecord:
    sha: str
    purpose: str  # endpoint (verifying --good/--bad), search, or parent (for the report)
    round: int  # search round; 0 for endpoint checks and results known from the cache
    cached: bool
    device: str | None  # CUDA_VISIBLE_DEVICES it ran with, when pinned
    command: str  # what ran (its label)
    outcome: ProbeOutcome

    def to_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "purpose": self.purpose, "round": self.round, "cached": self.cached,
                "device": self.device, "command": self.command, **self.outcome.to_json()}


@dataclass
class BisectResult:
    good: str
    bad: str
    command: str
    oracle: str  # reference, good-end, recorded, or the --run command's exit code
    oracle_note: str  # what that oracle compared, and why it was chosen
    range_size: int
    first_bad: CommitInfo | None  # None when skips left several candidates
    candidates: list[CommitInfo]  # oldest first; [first_bad] when found
    first_bad_probe: ProbeRecord | None
    parent_probe: ProbeRecord | None
    probes: list[ProbeRecord]  # in the order they finished, cached ones included
    rounds: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def probes_run(self) -> int:
        return sum(not p.cached for p in self.probes)

    def probes_run_for(self, purpose: str) -> int:
        return sum(not p.cached and p.purpose == purpose for p in self.probes)

    def to_json(self) -> dict[str, Any]:
        return {"status": "found" if self.first_bad else "ambiguous",
                "first_bad": self.first_bad.to_json() if self.first_bad else None,
                "candidates": [c.to_json() for c in self.candidates],
                "first_bad_probe": self.first_bad_probe.to_json() if self.first_bad_probe else None,
                "parent_probe": self.parent_probe.to_json() if self.parent_probe else None,
                "good": self.good, "bad": self.bad, "command": self.command, "oracle": self.oracle,
                "oracle_note": self.oracle_note, "range_size": self.range_size,
                "probes_run": self.probes_run, "search_probes": self.probes_run_for("search"),
                "cache_hits": sum(p.cached for p in self.probes), "rounds": self.rounds,
                "seconds": round(self.seconds, 3), "warnings": self.warnings,
                "probes": [p.to_json() for p in self.probes]}
