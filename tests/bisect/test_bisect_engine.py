"""The engine probe end to end: `replay run SNAPSHOT --code WORKTREE --json -` on each commit, under each oracle."""
from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

import pytest
import torch

import replay
from replay import registry
from replay.bisect import BisectError, BisectOptions, SyntheticCommit, run_bisect, write_history

MODULE, OP = "bisect_toy_kernels", "bisect_toy_scale"
PROVIDER = '''import torch
import replay

scale = replay.op("OP", batch_axes={"x": 0, "out": 0})


@scale.reference
def reference(x):
    return (x.double() * 2).to(x.dtype)


@scale.batched
def batched(x):
    out = x * 2
BUG    return out
'''.replace("OP", OP)
CLEAN, BUGGY = PROVIDER.replace("BUG", ""), PROVIDER.replace("BUG", "    out[1:] += 1  # rows after the first drift\n")


@contextlib.contextmanager
def kernels_of(source: str, where: Path):
    """The toy kernel module with `source`, imported in this process for the block, then forgotten."""
    where.mkdir()
    (where / f"{MODULE}.py").write_text(source)
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(where))
        sys.modules.pop(MODULE, None)
        registry._OPS.pop(OP, None)


def record_batched_call(source: str, tmp_path: Path, name: str) -> Path:
    """A snapshot of one batched call of the kernel with `source`."""
    with kernels_of(source, tmp_path / f"{name}-source") as kernels, replay.recording(tmp_path / name):
        kernels.batched(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
    return tmp_path / name


@pytest.fixture
def recorded(tmp_path):
    """A snapshot of the clean kernel's batched call, recorded at the good end."""
    return record_batched_call(CLEAN, tmp_path, "snapshot")


def test_the_engine_probe_finds_the_commit_and_shows_its_report_beside_its_parents(tmp_path, recorded):
    commits = [SyntheticCommit("kernels", {f"{MODULE}.py": CLEAN})]
    commits += [SyntheticCommit(f"docs {i}", {"README": f"{i}\n"}) for i in range(1, 3)]
    commits += [SyntheticCommit("faster batched scale", {f"{MODULE}.py": BUGGY})]
    commits += [SyntheticCommit("docs 4", {"README": "4\n"})]
    shas = write_history(tmp_path / "repo", commits)
    # a loose module, not a package: trusted only because it is named, and bisect passes that on to its probes
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded, repo=tmp_path / "repo", jobs=2,
                                      providers=(MODULE,)))
    assert result.first_bad.sha == shas[3]
    bad, parent = result.first_bad_probe.outcome.report, result.parent_probe.outcome.report
    assert bad["passed"] is False and bad["first_divergence"]["op"] == OP
    assert bad["first_divergence"]["rows"] == [1, 2, 3]
    assert parent["passed"] is True


@pytest.fixture
def recorded_at_bad_end(tmp_path):
    """The buggy kernel's batched call recorded, as a user records where the bug shows."""
    return record_batched_call(BUGGY, tmp_path, "bad-snapshot")


def history(tmp_path, bug_at: int, buggy: str = BUGGY, extra: dict[int, str] | None = None) -> list[str]:
    """Five commits of the toy kernel: clean, then docs, with `buggy` from commit `bug_at` on and the
    sources in `extra` at single commits. Three commits lie between the ends: a search of more than
    one round, with few probes (each a `replay run` in a fresh process)."""
    commits = [SyntheticCommit("kernels", {f"{MODULE}.py": CLEAN})]
    for i in range(1, 5):
        files = {"README": f"{i}\n"}
        if i == bug_at:
            files[f"{MODULE}.py"] = buggy
        if i in (extra or {}):
            files[f"{MODULE}.py"] = extra[i]
        commits.append(SyntheticCommit(f"commit {i}", files))
    return write_history(tmp_path / "repo", commits)


def test_a_snapshot_recorded_at_the_bad_end_bisects_to_the_commit(tmp_path, recorded_at_bad_end):
    shas = history(tmp_path, bug_at=3)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.first_bad.sha == shas[3]
    assert result.oracle == "reference"  # the recorded outputs are the bug's: no oracle for older commits


def test_a_verify_mismatch_snapshot_bisects_as_it_is(tmp_path):
    with kernels_of(BUGGY, tmp_path / "production") as kernels:
        replay.verify.configure(directory=tmp_path / "mismatches")
        replay.verify(OP, sample=1.0, outliers=False)
        try:
            kernels.batched(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
            replay.verify.drain()
        finally:
            replay.verify.stop(OP)
    (mismatch,) = (tmp_path / "mismatches").iterdir()
    shas = history(tmp_path, bug_at=3)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=mismatch, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.first_bad.sha == shas[3]


RENAMED = CLEAN.replace("def batched(x):", "def batched(inputs):").replace("out = x * 2", "out = inputs * 2")


def test_a_commit_that_cannot_take_the_recorded_arguments_is_skipped_not_blamed(tmp_path, recorded_at_bad_end):
    # commit 1 renames the batched variant's argument (undone at 2); the bug comes in at 3
    shas = history(tmp_path, bug_at=3, extra={1: RENAMED, 2: CLEAN})
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,), jobs=3))  # one round: every commit is probed
    assert result.first_bad.sha == shas[3]
    skipped = {p.sha: p.outcome for p in result.probes if p.outcome.verdict == "skip"}
    assert list(skipped) == [shas[1]] and skipped[shas[1]].exit_code == 125
    assert "no longer takes the recorded arguments" in skipped[shas[1]].report["untestable"]


def test_skips_around_the_answer_give_the_range(tmp_path, recorded_at_bad_end):
    # the commit before the bug cannot take the recorded arguments: either may be the first bad one
    shas = history(tmp_path, bug_at=3, extra={2: RENAMED})
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.first_bad is None
    assert [c.sha for c in result.candidates] == [shas[2], shas[3]]


INSIDE_TOLERANCE = CLEAN.replace("out = x * 2", "out = x * 2 * (1 + 2 ** -20)")  # a few float32 ulps: inside tolerance


def test_a_bug_inside_tolerance_is_found_against_the_good_ends_outputs(tmp_path, recorded_at_bad_end):
    shas = history(tmp_path, bug_at=2, buggy=INSIDE_TOLERANCE)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.oracle == "good-end" and "both ends pass the reference checks" in result.oracle_note
    assert result.first_bad.sha == shas[2]
    with pytest.raises(BisectError, match="is actually good under the reference oracle"):
        run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                 providers=(MODULE,), oracle="reference"))


def test_the_recorded_oracle_holds_each_commit_to_a_good_end_recording(tmp_path, recorded):
    shas = history(tmp_path, bug_at=2, buggy=INSIDE_TOLERANCE)  # inside tolerance: only the bits tell
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded, repo=tmp_path / "repo",
                                      providers=(MODULE,), oracle="recorded"))
    assert result.oracle == "recorded" and result.first_bad.sha == shas[2]
    with pytest.raises(BisectError, match="--oracle recorded: applies to the replay probe, not to --run"):
        run_bisect(BisectOptions(good=shas[0], bad="HEAD", repo=tmp_path / "repo", run="true", oracle="recorded"))


NOISY = CLEAN.replace("out = x * 2", "out = x * 2 + torch.rand_like(x) * 1e-6")  # not the same bits twice
NOISY_AND_OFF = NOISY.replace("out = x * 2", "out = x * 2 * (1 + 2e-5)")  # off by more than the noise


def test_a_good_end_not_deterministic_run_to_run_is_held_within_its_spread(tmp_path, recorded_at_bad_end):
    commits = [SyntheticCommit("noisy kernels", {f"{MODULE}.py": NOISY})]
    commits += [SyntheticCommit(f"docs {i}", {"README": f"{i}\n"}) for i in range(1, 3)]
    commits += [SyntheticCommit("scale a little differently", {f"{MODULE}.py": NOISY_AND_OFF})]
    commits += [SyntheticCommit("docs 4", {"README": "4\n"})]
    shas = write_history(tmp_path / "repo", commits)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.oracle == "good-end" and "it is not deterministic run to run" in result.oracle_note
    assert result.first_bad.sha == shas[3]


def test_a_snapshot_cut_short_by_a_killed_recording_still_bisects(tmp_path, recorded_at_bad_end):
    with open(recorded_at_bad_end / "calls.jsonl", "a") as index:
        index.write('{"index": 1, "op": "bis')  # the recording was killed mid-append
    shas = history(tmp_path, bug_at=3)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded_at_bad_end, repo=tmp_path / "repo",
                                      providers=(MODULE,)))
    assert result.first_bad.sha == shas[3]
    assert "the last line is cut short" in result.warnings[0] and "replay the calls that can be read" in \
        result.warnings[0]
