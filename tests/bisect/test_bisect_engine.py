"""The default probe end to end: `replay run SNAPSHOT --code WORKTREE --json -` on each commit."""
from __future__ import annotations

import importlib
import sys

import pytest
import torch

import replay
from replay import registry
from replay.bisect import BisectOptions, SyntheticCommit, run_bisect, write_history

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


@pytest.fixture
def recorded(tmp_path):
    """A snapshot of the clean kernel's batched call, recorded in this process and then forgotten."""
    source = tmp_path / "recording"
    source.mkdir()
    (source / f"{MODULE}.py").write_text(CLEAN)
    sys.path.insert(0, str(source))
    try:
        kernels = importlib.import_module(MODULE)
        with replay.recording(tmp_path / "snapshot"):
            kernels.batched(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
    finally:
        sys.path.remove(str(source))
        sys.modules.pop(MODULE, None)
        registry._OPS.pop(OP, None)
    return tmp_path / "snapshot"


def test_the_engine_probe_finds_the_commit_and_shows_its_report_beside_its_parents(tmp_path, recorded):
    commits = [SyntheticCommit("kernels", {f"{MODULE}.py": CLEAN})]
    commits += [SyntheticCommit(f"docs {i}", {"README": f"{i}\n"}) for i in range(1, 4)]
    commits += [SyntheticCommit("faster batched scale", {f"{MODULE}.py": BUGGY})]
    commits += [SyntheticCommit(f"docs {i}", {"README": f"{i}\n"}) for i in range(5, 7)]
    shas = write_history(tmp_path / "repo", commits)
    # a loose module, not a package: trusted only because it is named, and bisect passes that on to its probes
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded, repo=tmp_path / "repo", jobs=2,
                                      providers=(MODULE,)))
    assert result.first_bad.sha == shas[4]
    bad, parent = result.first_bad_probe.outcome.report, result.parent_probe.outcome.report
    assert bad["passed"] is False and bad["first_divergence"]["op"] == OP
    assert bad["first_divergence"]["rows"] == [1, 2, 3]
    assert parent["passed"] is True
