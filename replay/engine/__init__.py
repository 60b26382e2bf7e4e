"""The replay engine: re-run recorded calls against variants, goldens and contracts."""
from replay.engine.report import CallReport, Check, RunReport
from replay.engine.session import ReplayOptions, check_arguments, replay_snapshot

__all__ = ["CallReport", "Check", "ReplayOptions", "RunReport", "check_arguments", "replay_snapshot"]
