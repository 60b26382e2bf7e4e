"""A recording process killed with SIGKILL, at moments picked at random, leaves a snapshot whose
indexed calls all read back: the pipelined capture (REPLAY_CAPTURE's default) indexes a call
only once its file is whole."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fixtures.make_fixture_snapshot import make_fixture_snapshot
from replay.errors import SnapshotError
from replay.snapshot import Snapshot

# Records forever: every step writes a 256 KiB blob (an input), a 256 KiB inline output and a
# 2 MiB cache it changes a row of (in chunks, its new pieces packed), so most of the time goes
# into writing files and a kill lands mid-write.
RECORDER = textwrap.dedent("""
    import torch, replay

    @replay.capture("crash_double")
    def double(x, step):
        return x * 2

    @replay.capture("crash_fill", mutates=("cache",))
    def fill(cache, step):
        cache[step % 16] = float(step)

    cache = torch.zeros(16, 32768)
    step = 0
    while True:
        double(torch.full((64, 1024), float(step)), step)
        fill(cache, step)
        step += 1
""")


def index_lines(snapshot: Path) -> int:
    try:
        return (snapshot / "calls.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("seed", range(10))
def test_sigkill_mid_recording_leaves_finished_calls_readable(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    calls_before_kill, then_wait = rng.randint(1, 30), rng.uniform(0.0, 0.05)
    snapshot = tmp_path / "snap"
    env = dict(os.environ, REPLAY_CAPTURE=str(snapshot))
    child = subprocess.Popen([sys.executable, "-c", RECORDER], env=env, stderr=subprocess.PIPE)
    try:
        # generous: on a GPU machine running fifteen test workers beside torch.compile's, a fresh
        # interpreter took over a minute to record its first calls (2026-11-27)
        deadline = time.monotonic() + 240
        while index_lines(snapshot) < calls_before_kill:
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the recorder never reached the kill point"
            time.sleep(0.002)
        time.sleep(then_wait)
        assert child.poll() is None  # still recording when killed
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    read = Snapshot(snapshot)  # verifies sha256 of every file it loads
    assert len(read) >= calls_before_kill
    for record in read:
        step = record.arguments()["step"]
        if record.op == "crash_fill":  # the row it wrote, and nothing else changed
            before, after = record.tensors["in/cache"].clone(), record.tensors["out/cache"]
            assert torch.equal(after[step % 16], torch.full((32768,), float(step)))
            before[step % 16] = float(step)
            assert torch.equal(before, after)
            continue
        assert torch.equal(record.tensors["in/x"], torch.full((64, 1024), float(step)))
        assert torch.equal(record.tensors["out/out"], torch.full((64, 1024), 2.0 * step))
    assert sorted(e.index for e in read.entries) == list(range(len(read)))


def test_cut_off_index_line_is_reported_and_the_whole_lines_kept(tmp_path: Path) -> None:
    snapshot = make_fixture_snapshot(tmp_path / "snap")
    complete = len(Snapshot(snapshot))
    with open(snapshot / "calls.jsonl", "a") as f:
        f.write('{"index": 99, "op": "fixture_linear", "variant": "defa')  # a short write
    (snapshot / "segments" / ".00000099.safetensors.1.2.tmp").write_bytes(b"half a file")
    read = Snapshot(snapshot, strict=False)
    assert len(read) == complete
    assert all(record.index != 99 for record in read)
    assert read.problems == [f"{snapshot / 'calls.jsonl'}:{complete + 1}: the last line is cut short (54 bytes, no "
                             "newline): its call is not indexed"]
    with pytest.raises(SnapshotError, match="the last line is cut short"):
        Snapshot(snapshot)  # strict, as every command but run, show and diff opens one
