"""scripts/writers_held.py: recorded steps in turns, the writers working, held still, and under
other switch intervals, in one process (CPU smoke shapes)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import replay
from replay.recorder import pipeline

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "writers_held.py"


def test_each_kind_takes_its_turns_and_is_summed_up() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "8", "64", "2", "128", "96", "--rounds", "2",
                           "--block", "2", "--switch-intervals", "5"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][2:]
    kinds = {}
    for row in rows:
        found = re.fullmatch(r"\| (\w+) \| (\d+) \| (\d+\.\d\d) \| (\d+\.\d\d) \|", row)
        assert found, row
        kinds[found[1]] = int(found[2])
    assert kinds == {"bare": 2, "working": 4, "held": 4, "si5": 4}  # two turns of two steps each


def test_held_writers_write_nothing_until_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    finished: list[int] = []
    finish = pipeline.CallWriter._finish

    def counted(self: pipeline.CallWriter, *args: object) -> None:
        finished.append(1)
        finish(self, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(pipeline.CallWriter, "_finish", counted)  # the script wraps this; put back after
    spec = importlib.util.spec_from_file_location("writers_held", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    going = script.hold_writers()
    double = replay.capture("writers_held_double")(lambda x: x * 2)
    with replay.recording(tmp_path / "snap") as recording:
        going.clear()
        for _ in range(3):
            double(torch.ones(4))
        time.sleep(0.5)  # time enough for a writer that is not held
        assert finished == []
        going.set()
        recording.flush()
        assert len(finished) == 3 and recording.calls_written == 3


def test_a_small_op_step_takes_its_turns_too() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--small-op", "5", "--block", "1", "--rounds", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    kinds = [line.split(" | ")[0].strip("| ") for line in done.stdout.splitlines() if line.startswith("| ")][2:]
    assert kinds == ["bare", "working", "held"]
