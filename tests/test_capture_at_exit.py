"""A recording closed as the interpreter exits (REPLAY_CAPTURE, `replay record`) writes every call:
by then Python's thread pools take no work ("cannot schedule new futures after interpreter
shutdown"), so what the writers hash on a pool is hashed on their own thread instead. A SIGTERM
(a scheduler's or a timeout's polite kill) writes every call before it ends the process; a program
that ignores SIGTERM goes on ignoring it, and a forked child's SIGTERM is its own."""
from __future__ import annotations

import concurrent.futures.thread
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replay.snapshot import Snapshot, hashing, writer
from replay.snapshot.files import sha256_parts

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + at, tl.load(x_ptr + at, mask=at < n) * 2, mask=at < n)
"""
PROGRAM = """
import torch
from kern import scale

x = torch.randn(1 << 21)  # 8 MiB: 128 pieces, hashed on the pool in two tasks
for _ in range(3):
    out = torch.empty_like(x)
    scale[(x.numel() // 65536,)](x, out, x.numel(), BLOCK=65536)
"""  # the program ends at its last launch: its recording is closed at exit


@pytest.fixture
def exiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)


def test_pieces_are_hashed_here_when_the_pool_takes_no_work(exiting: None) -> None:
    pieces = [np.full(64, n % 251, dtype=np.uint8) for n in range(3 * hashing.PIECES_PER_TASK)]
    assert hashing.hash_pieces(pieces) == hashing.hash_pieces_here(pieces)


def test_a_file_is_hashed_after_its_write_when_no_thread_takes_work(exiting: None) -> None:
    written: list[bytes] = []
    parts = [b"kernel", b"-replay"]
    assert writer._hashed_while(lambda: written.append(b"".join(parts)), parts) == sha256_parts(*parts)
    assert written == [b"kernel-replay"]


def test_a_program_recorded_to_its_last_launch_keeps_every_call(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "replay", "record", "-o", str(tmp_path / "snap"), "--",
                           sys.executable, str(tmp_path / "prog.py")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "recorded 3 calls" in said and "capture error" not in said, said
    replayed = subprocess.run([sys.executable, "-m", "replay", "run", str(tmp_path / "snap"), "--code", str(tmp_path)],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


ENDINGS = """
import os, signal, sys, time
import torch
from kern import scale

how = sys.argv[1]
x = torch.randn(1 << 16)
for n in range(3):
    out = torch.empty_like(x)
    scale[(1,)](x, out, x.numel(), BLOCK=65536)
    if n == 1 and how == "fork":  # a child forked mid-recording, ended by SIGTERM: nothing of its own to write
        ready, say_ready = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(say_ready, b"!")  # running Python: a signal now is not one Python drops at the fork
            time.sleep(60)
            os._exit(0)
        os.read(ready, 1)
        os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while os.waitpid(child, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "the forked child did not end on SIGTERM"
            time.sleep(0.05)
if how in ("term", "ignored"):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
    scale[(1,)](x, out, x.numel(), BLOCK=65536)  # recorded where the signal is ignored: the recording goes on
print("went on", flush=True)
"""


@pytest.mark.parametrize("how", ["term", "ignored", "fork"])
def test_sigterm_writes_every_call_before_the_process_ends(tmp_path: Path, how: str) -> None:
    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "endings.py").write_text(ENDINGS)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(tmp_path)}
    runner = ("import replay, runpy, signal, sys\n"
              "if sys.argv[3] == 'ignored':  # before the recording starts: it must not stop ignoring it\n"
              "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "with replay.recording(sys.argv[1]):\n"
              "    sys.argv = sys.argv[2:]\n"
              "    runpy.run_path(sys.argv[0], run_name='__main__')\n")
    program = subprocess.Popen([sys.executable, "-c", runner, str(tmp_path / "snap"), str(tmp_path / "endings.py"), how],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    out, err = program.communicate(timeout=300)
    if how == "term":
        assert program.returncode == -signal.SIGTERM and "went on" not in out, err
    else:
        assert program.returncode == 0 and "went on" in out, err
    assert len(Snapshot(tmp_path / "snap")) == (4 if how == "ignored" else 3), err
    assert json.loads((tmp_path / "snap" / "manifest.json").read_text())["capture_errors"] == []


WAITING = """
import sys, time
import torch
from kern import scale

x = torch.randn(1 << 16)
for _ in range(3):
    out = torch.empty_like(x)
    scale[(1,)](x, out, x.numel(), BLOCK=65536)
print("ready", flush=True)
time.sleep(30)  # ended by the SIGTERM passed on long before
"""


def test_a_sigterm_sent_to_replay_record_is_the_programs_and_every_call_is_written(tmp_path: Path) -> None:
    """`timeout 60 replay record -- python train.py` signals `replay record` alone: the program gets
    it, writes its calls and ends, and `replay record` says what was recorded, with the signal's code."""
    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "waiting.py").write_text(WAITING)
    recorder = subprocess.Popen([sys.executable, "-m", "replay", "record", "-o", str(tmp_path / "snap"), "--",
                                 sys.executable, str(tmp_path / "waiting.py")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "TRITON_INTERPRET": "1"},
                                cwd=tmp_path)
    try:
        assert recorder.stdout is not None and recorder.stdout.readline().strip() == "ready"
        recorder.send_signal(signal.SIGTERM)
        out, err = recorder.communicate(timeout=120)
    finally:
        recorder.kill()
    assert recorder.returncode == 128 + signal.SIGTERM, err
    assert "recorded 3 calls" in out + err and len(Snapshot(tmp_path / "snap")) == 3, err


def test_a_sigterm_handler_the_program_sets_while_recording_stays_after(tmp_path: Path) -> None:
    import replay

    before = signal.getsignal(signal.SIGTERM)
    try:
        with replay.recording(tmp_path / "snap"):
            assert signal.getsignal(signal.SIGTERM) is not before  # the recording's, while it runs
            signal.signal(signal.SIGTERM, own_handler)
        assert signal.getsignal(signal.SIGTERM) is own_handler
        with replay.recording(tmp_path / "again"):
            pass
        assert signal.getsignal(signal.SIGTERM) is own_handler  # put back where the recording set its own
    finally:
        signal.signal(signal.SIGTERM, before)


def own_handler(number: int, frame: object) -> None:
    """A program's own SIGTERM handler (never called here)."""
