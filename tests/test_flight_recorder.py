"""The flight recorder, `replay.recording(path, ring=N)`: only the last N calls are kept (within a
byte budget), and written when an exception leaves the block, on replay.dump(), on SIGUSR1 (the
program goes on) and on SIGTERM (it ends); a block left normally writes none."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import replay
from replay.snapshot import Snapshot


@replay.capture("flight_step")
def step(x: torch.Tensor, n: int) -> torch.Tensor:
    return x + n


def steps_recorded(path: Path) -> list[int]:
    return [record.arguments()["n"] for record in Snapshot(path)]


def test_an_exception_leaving_the_block_writes_the_last_calls(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="step 9 went wrong"):
        with replay.recording(tmp_path / "snap", ring=3):
            for n in range(10):
                out = step(torch.zeros(4), n)
            raise RuntimeError("step 9 went wrong")
    assert steps_recorded(tmp_path / "snap") == [7, 8, 9]
    record = Snapshot(tmp_path / "snap").load(Snapshot(tmp_path / "snap").entries[-1])
    assert torch.equal(record.tensors["out/out"], out) and record.index == 9


def test_dump_writes_what_the_ring_holds_and_recording_goes_on(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", ring=4):
        for n in range(10):
            step(torch.zeros(4), n)
        assert replay.dump() == 4
        assert steps_recorded(tmp_path / "snap") == [6, 7, 8, 9]
        for n in range(10, 12):
            step(torch.zeros(4), n)
        assert replay.dump() == 2
    assert steps_recorded(tmp_path / "snap") == [6, 7, 8, 9, 10, 11]


def test_a_block_left_normally_writes_nothing_and_the_byte_budget_holds(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "quiet", ring=5):
        for n in range(8):
            step(torch.zeros(4), n)
    assert steps_recorded(tmp_path / "quiet") == []
    # 1 KiB a call (input and output of 128 floats) in a 2.5 KiB budget: two calls fit
    with replay.recording(tmp_path / "budget", ring=100, ring_bytes=2560):
        for n in range(8):
            step(torch.zeros(128), n)
        replay.dump()
    assert steps_recorded(tmp_path / "budget") == [6, 7]


@pytest.mark.parametrize("option, value", [("ring", 0), ("ring_bytes", 0)])
def test_bad_ring_options_are_clear_errors(option: str, value: int, tmp_path: Path) -> None:
    options = {"ring": 4, option: value}
    with pytest.raises(ValueError, match=f"{option}={value}"):
        with replay.recording(tmp_path / "snap", **options):
            pass
    assert not (tmp_path / "snap").exists()


FLYING = textwrap.dedent("""
    import sys, time, torch, replay

    @replay.capture("flight_step")
    def step(x, n):
        return x + n

    with replay.recording(sys.argv[1], ring=5):
        n = 0
        while True:
            step(torch.zeros(4), n)
            print(n, flush=True)
            n += 1
            time.sleep(0.002)
""")


def test_sigusr1_writes_and_goes_on_and_sigterm_writes_and_ends(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap"
    child = subprocess.Popen([sys.executable, "-c", FLYING, str(snapshot)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        while int(child.stdout.readline()) < 20:
            pass
        child.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while len(Snapshot(snapshot)) < 5:  # a complete index line per call, written as the ring dumps
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        first = steps_recorded(snapshot)
        while int(child.stdout.readline()) < first[-1] + 30:  # still running
            pass
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    written = steps_recorded(snapshot)
    assert len(first) == 5 and first == list(range(first[0], first[0] + 5))
    assert written[:5] == first and len(written) == 10 and written[5] > first[-1] + 25
    assert written[5:] == list(range(written[5], written[5] + 5))
    assert json.loads((snapshot / "manifest.json").read_text())["capture_errors"] == []


SIGNAL_WHILE_LOCKED = textwrap.dedent("""
    import faulthandler, os, signal, sys, torch, replay
    faulthandler.dump_traceback_later(20, exit=True)  # a deadlock ends the child, with its stacks

    @replay.capture("flight_step")
    def step(x, n):
        return x + 1

    with replay.recording(sys.argv[1], ring=4) as rec:
        for n in range(3):
            step(torch.zeros(4), n)
        write_manifest = rec.writer._write_manifest

        def signalled():  # SIGUSR1 lands while the main thread holds the writer's lock
            os.kill(os.getpid(), signal.SIGUSR1)
            return write_manifest()
        rec.writer._write_manifest = signalled
        step(torch.zeros(4), object())  # a capture error: reported into the manifest, under the lock
        rec.writer._write_manifest = write_manifest
        replay.flush()
    print("done", flush=True)
""")


def test_a_signal_arriving_while_the_writer_is_locked_does_not_deadlock(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_LOCKED, str(tmp_path / "snap")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr


SLOW_DUMP = textwrap.dedent("""
    import sys, time, torch, replay
    from replay.snapshot import writer

    @replay.capture("flight_step")
    def step(x, n):
        return x + n

    real = writer.SnapshotWriter.call_part

    def slowly(*args, **kwargs):  # a dump that takes a while: 40 calls, 20 ms each
        time.sleep(0.02)
        return real(*args, **kwargs)

    writer.SnapshotWriter.call_part = staticmethod(slowly)
    with replay.recording(sys.argv[1], ring=40):
        for n in range(40):
            step(torch.zeros(4), n)
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
""")


@pytest.mark.parametrize("gap", [0.05, 0.15, 0.3])  # the dump takes 0.8 s
def test_a_second_sigterm_does_not_cut_the_dump_short(tmp_path: Path, gap: float) -> None:
    snapshot = tmp_path / "snap"
    child = subprocess.Popen([sys.executable, "-c", SLOW_DUMP, str(snapshot)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        time.sleep(gap)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    assert steps_recorded(snapshot) == list(range(40))
    assert "SIGTERM again while the recording is written: it is finished first" in child.stderr.read()


TWO_FLIGHTS = textwrap.dedent("""
    import os, signal, sys, time, torch, replay

    handled = []
    signal.signal(signal.SIGTERM, lambda number, frame: handled.append(number))  # the program's own

    @replay.capture("flight_step")
    def step(x, n):
        return x + n

    for k, path in enumerate(sys.argv[1:]):
        with replay.recording(path, ring=3):
            for n in range(3):
                step(torch.zeros(4), n)
            os.kill(os.getpid(), signal.SIGTERM)  # dumped, then passed on to the program's handler
            deadline = time.monotonic() + 30
            while len(handled) <= k and time.monotonic() < deadline:
                time.sleep(0.01)
    print(len(handled), flush=True)
""")


def test_each_flight_recording_of_a_process_is_dumped_on_sigterm(tmp_path: Path) -> None:
    paths = [tmp_path / "first", tmp_path / "second"]
    done = subprocess.run([sys.executable, "-c", TWO_FLIGHTS, *map(str, paths)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "2\n", done.stderr
    assert [steps_recorded(path) for path in paths] == [[0, 1, 2], [0, 1, 2]]
