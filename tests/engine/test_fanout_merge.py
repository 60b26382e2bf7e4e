"""How `replay run --executor ray` puts its shards' reports together (no Ray needed: the merge alone)."""
from __future__ import annotations

from replay.engine.fanout import merge, shards
from replay.engine.report import CallReport, RunReport
from replay.engine.session import TOLERANCE_UNUSED, ReplayOptions


def shard(indices: list[int], warnings: list[str], untestable: int | None = None) -> RunReport:
    report = RunReport("snap", "cpu", "variants", warnings=warnings)
    report.calls = [CallReport(i, "op", "batched", untestable="gone" if i == untestable else None) for i in indices]
    return report


def test_shards_are_contiguous_and_cover_every_call_once() -> None:
    split = shards(list(range(10)), 3)
    assert split == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]] and shards([5], 4) == [[5]]


def test_merge_orders_calls_stops_where_a_run_would_and_says_warnings_once() -> None:
    merged = merge("snap", [shard([3, 4, 5], ["same"]), shard([0, 1, 2], ["same"], untestable=1)], ReplayOptions())
    assert [c.index for c in merged.calls] == [0, 1] and merged.warnings == ["same"]  # a run stops at call 1


def test_unused_tolerance_is_said_only_where_no_shard_used_it() -> None:
    some = merge("snap", [shard([0], [TOLERANCE_UNUSED]), shard([1], [])], ReplayOptions(atol=1e-3))
    every = merge("snap", [shard([0], [TOLERANCE_UNUSED]), shard([1], [TOLERANCE_UNUSED])], ReplayOptions(atol=1e-3))
    assert some.warnings == [] and every.warnings == [TOLERANCE_UNUSED]
