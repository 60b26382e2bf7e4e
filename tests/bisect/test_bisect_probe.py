"""Probes on their own: verdicts from exit codes, reports from stdout, GPUs, the engine's isolation."""
from __future__ import annotations

import pytest

from replay.bisect.parallel import device_for, visible_gpus
from replay.bisect.probe import HARNESS_ROOT, ProbeCommand, ProbeRunner, parse_report, verdict_for


@pytest.mark.parametrize(("code", "verdict", "reason"), [
    (0, "good", "exit 0"), (1, "bad", "exit 1"), (125, "skip", "exit 125: cannot be tested"),
    (2, "skip", "exit 2: not a verdict (0 good, 1 bad, 125 skip)"), (-9, "skip", "killed by SIGKILL")])
def test_verdicts_from_exit_codes(code, verdict, reason):
    assert verdict_for(code) == (verdict, reason)


def test_the_report_is_the_json_object_on_stdout_or_its_last_json_line():
    assert parse_report('{"passed": false}\n') == {"passed": False}
    assert parse_report('{\n  "passed": true\n}') == {"passed": True}
    assert parse_report('building...\n{"x": 1}\n') == {"x": 1}
    assert parse_report("[1, 2]") is None
    assert parse_report("FAILED tests/test_x.py") is None


def test_gpus_come_from_cuda_visible_devices_and_pin_only_with_several(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3,")
    assert visible_gpus(jobs=1) == ["2", "3"]
    assert [device_for(slot, ["2", "3"]) for slot in range(3)] == ["2", "3", "2"]
    assert device_for(0, ["0"]) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus(jobs=4) == []


def test_the_engine_probe_runs_this_harness_not_a_replay_package_in_the_worktree(tmp_path):
    worktree = tmp_path / "worktree"
    (worktree / "replay").mkdir(parents=True)
    for name in ("__init__.py", "__main__.py"):
        (worktree / "replay" / name).write_text("raise SystemExit('POISON: imported from the worktree')\n")
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    command = ProbeCommand.engine(tmp_path / "no-such-snapshot")
    call = command.invocation(worktree, neutral)
    assert call.cwd == neutral
    assert call.env["PYTHONPATH"].split(":")[0] == str(HARNESS_ROOT)
    assert call.args[-4:] == ["--code", str(worktree), "--json", "-"]
    outcome = ProbeRunner(timeout=120, neutral_dir=neutral).run(command, worktree, "0" * 40)
    assert "POISON" not in outcome.output_tail
    assert outcome.exit_code not in (0, 1)  # the snapshot does not exist: never a verdict
