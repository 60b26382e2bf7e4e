"""While a recording's writers run, the interpreter's switch interval is short (a program thread
waiting for the lock a writer holds waits at most that long), and the program's own comes back when
the recording stops, unless the program set another meanwhile."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import replay
from replay.recorder import lifecycle


@pytest.fixture
def program_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


def test_writers_running_shorten_it_and_stopping_gives_it_back(tmp_path: Path, program_interval: float) -> None:
    with replay.recording(tmp_path / "snap"):
        assert sys.getswitchinterval() == pytest.approx(lifecycle.SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(program_interval)


def test_a_recording_written_on_the_programs_thread_leaves_it_be(tmp_path: Path, program_interval: float) -> None:
    with replay.recording(tmp_path / "snap", asynchronous=False):
        assert sys.getswitchinterval() == pytest.approx(program_interval)


def test_an_interval_the_program_sets_while_recording_is_kept(tmp_path: Path, program_interval: float) -> None:
    with replay.recording(tmp_path / "snap"):
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_shorter_interval_of_the_programs_own_is_kept(tmp_path: Path, program_interval: float) -> None:
    sys.setswitchinterval(0.0001)
    with replay.recording(tmp_path / "snap"):
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)
