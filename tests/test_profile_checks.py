"""scripts/profile_checks.py, a diagnosis of what a check costs the program's steps around it (CPU
smoke: one small op): each variant's line, and bad arguments refused."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_checks.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", str(SCRIPT), "--device", "cpu", *args], capture_output=True,
                          text=True, timeout=300, cwd=SCRIPT.parents[1])


def test_each_variant_says_what_a_sampled_call_costs_its_step_and_the_steps_after() -> None:
    done = run("--workload", "small", "--runs", "3", "--variants", "built,burn,burst-same", "--spend", "100")
    assert done.returncode == 0, done.stderr
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines()[1:]}
    assert list(lines) == ["built", "burn", "burst-same"]  # the driver's variant needs a GPU: not asked for here
    for line in lines.values():
        assert re.search(r"run [+-]\d+ us \(mean [+-]\d+\), [\d.]+ sampled calls a run, "
                         r"-?\d+ us each \(mean\); unverified step \d+ us; ", line)
        assert "own time a call" in line and "rest of its step" in line
    burned = float(re.search(r"own time a call \+(\d+) us", lines["burn"]).group(1))  # type: ignore[union-attr]
    assert burned >= 100  # the tight loop's own time, counted where it runs


def test_a_variant_it_does_not_know_and_the_tiny_model_off_a_gpu_are_refused() -> None:
    done = run("--variants", "built,nope")
    assert done.returncode == 2 and "--variants: unknown nope" in done.stderr
    done = run("--workload", "tiny")
    assert done.returncode == 2 and "--workload tiny: the tiny model is timed on a GPU" in done.stderr
