"""Bisecting git history to the commit that made a probe fail (`replay bisect`).

    from replay.bisect import BisectOptions, run_bisect
    result = run_bisect(BisectOptions(good="v1.2", bad="HEAD", snapshot=Path("snapshots/prefill_001")))
    result.first_bad.sha, result.first_bad_probe.outcome.report
"""
from replay.bisect.driver import BisectOptions, run_bisect
from replay.errors import BisectError
from replay.bisect.history import CommitInfo
from replay.bisect.probe import ProbeOutcome
from replay.bisect.result import BisectResult, ProbeRecord
from replay.bisect.steps import Step, StepHandler, StepLog, fan_out
from replay.bisect.synthetic import SyntheticCommit, write_history

__all__ = ["BisectError", "BisectOptions", "BisectResult", "CommitInfo", "ProbeOutcome", "ProbeRecord", "Step",
           "StepHandler", "StepLog", "SyntheticCommit", "fan_out", "run_bisect",
           "write_history"]
