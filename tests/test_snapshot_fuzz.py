"""A mutation fuzz of the snapshot format: seeded changes to every kind of file a snapshot has
(tests/fuzz.py), re-signed so the deep parsers are reached, each run through `replay show` and
`replay run --call K`: a verdict (0, 1), bad input (2) or a call this code cannot make (125), in
bounded time and memory; never a traceback or an internal error. scripts/fuzz_snapshots.py runs
thousands of cases, each in a worker held to a time and a memory limit."""
from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest

import fuzz

CASES = 240
MAX_SECONDS = 20
MAX_GROWTH_BYTES = 600 << 20


def peak_resident_bytes(reset: bool = False) -> int:
    """This process's peak resident memory since the last reset (Linux: VmHWM, reset through
    /proc/self/clear_refs), so that each case is measured alone."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fuzz.record(tmp_path_factory.mktemp("fuzz") / "pristine")


def test_the_pristine_recording_replays_clean(pristine: Path) -> None:
    assert [fuzz.check(pristine, call) for call in range(3)] == [[], [], []]


@pytest.mark.parametrize("seed", range(CASES))
def test_a_mutated_snapshot_is_a_verdict_or_bad_input(seed: int, pristine: Path, tmp_path: Path) -> None:
    snapshot = tmp_path / "snap"
    shutil.copytree(pristine, snapshot)
    rng = random.Random(seed)
    what = fuzz.mutate(snapshot, rng)
    before, started = peak_resident_bytes(reset=True), time.monotonic()
    assert fuzz.check(snapshot, rng.randrange(3)) == [], what
    assert time.monotonic() - started < MAX_SECONDS, what
    assert peak_resident_bytes() - before < MAX_GROWTH_BYTES, what
