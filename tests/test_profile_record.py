"""scripts/profile_record.py, a diagnosis of a recorded step (CPU smoke shapes): the recorder's
steps timed with the writers held still, the writers' own steps timed, and a held run too long for
the writers' queue refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_record.py"
SMOKE = ["--shape", "8", "64", "2", "128", "96"]


def test_the_recorders_steps_are_timed_with_the_writers_held() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--steps", "4", "--timers", "--hold-writers"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(next(line for line in lines if line.startswith("recorded ms:")).split()) == 2 + 4
    timed = [line.split() for line in lines if line.endswith("LaunchRecorder.launch")]
    assert timed and float(timed[0][0]) > 0  # launches recorded a step, while the writers were held


def test_more_held_steps_than_the_writers_queue_holds_are_refused() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--steps", "12", "--hold-writers"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--hold-writers: --steps 12: give 3 to 5" in done.stderr


def test_the_writers_steps_are_timed_where_they_run() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--steps", "4", "--writer-timers"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[-1]: line.split() for line in done.stdout.splitlines() if line.startswith("  ")}
    assert float(rows["CallWriter._finish"][0]) > 0  # every recorded call is finished by a writer
    assert float(rows["CallWriter._finish"][4]) > 0  # and costs it processor time
    assert "LaunchRecorder.launch" not in rows  # the program's steps are not among them
