"""REPLAY_CAPTURE=path records a whole process; a bad target never stops the program."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from replay.snapshot import Snapshot

PROGRAM = textwrap.dedent("""
    import torch, replay

    @replay.capture("env_add")
    def add(x, y):
        return x + y

    total = torch.zeros(3)
    for step in range(3):
        total = add(total, torch.ones(3))
    print(total.tolist())
""")


def run_program(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120)


def test_replay_capture_env_records_the_process(tmp_path: Path) -> None:
    done = run_program(REPLAY_CAPTURE=str(tmp_path / "snap"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3.0, 3.0, 3.0]"
    snapshot = Snapshot(tmp_path / "snap")
    assert [(r.op, r.tensors["out/out"].tolist()) for r in snapshot] == [
        ("env_add", [1.0] * 3), ("env_add", [2.0] * 3), ("env_add", [3.0] * 3)]
    assert torch.equal(snapshot.load(2).tensors["in/x"], torch.full((3,), 2.0))


@pytest.mark.parametrize("target, reason", [
    ("snap", "already holds a snapshot; record into a new directory"),  # made a snapshot below
    ("file", "cannot record a snapshot here: Not a directory"),
    ("file/snap", "cannot record a snapshot here: Not a directory"),
])
def test_unusable_replay_capture_target_is_reported_and_the_program_runs(target: str, reason: str,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "manifest.json").write_text("{}")  # already a snapshot
    (tmp_path / "file").write_text("a regular file")
    done = run_program(REPLAY_CAPTURE=str(tmp_path / target))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3.0, 3.0, 3.0]"
    assert done.stderr.splitlines() == [f"replay: capture: {tmp_path / target}: {reason}; not recording"]


def test_a_byte_budget_stops_the_recording_and_says_where(tmp_path: Path) -> None:
    # each call stores x and y (3 floats each) and its output: 36 bytes; 120 holds all three
    done = run_program(REPLAY_CAPTURE=str(tmp_path / "snap"), REPLAY_CAPTURE_MAX_BYTES="120")
    assert done.returncode == 0 and done.stdout.strip() == "[3.0, 3.0, 3.0]", done.stderr
    assert len(Snapshot(tmp_path / "snap")) == 3 and "budget" not in done.stderr
    done = run_program(REPLAY_CAPTURE=str(tmp_path / "cut"), REPLAY_CAPTURE_MAX_BYTES="60")
    assert done.returncode == 0 and done.stdout.strip() == "[3.0, 3.0, 3.0]", done.stderr
    assert len(Snapshot(tmp_path / "cut")) == 2  # the call that crossed it kept whole, none after
    (error,) = json.loads((tmp_path / "cut" / "manifest.json").read_text())["capture_errors"]
    assert "the byte budget is spent: 72 bytes recorded, max_bytes=60; recording stopped after call 1" in error
    assert "the byte budget is spent" in done.stderr


@pytest.mark.parametrize("value", ["12Q", "-1", "1.5G"])
def test_a_malformed_byte_budget_is_named(value: str, tmp_path: Path) -> None:
    done = run_program(REPLAY_CAPTURE=str(tmp_path / "snap"), REPLAY_CAPTURE_MAX_BYTES=value)
    assert done.returncode == 0 and "REPLAY_CAPTURE_MAX_BYTES" in done.stderr, done.stderr  # the program still runs


def test_a_byte_budget_stops_a_strict_recording_without_raising(tmp_path: Path) -> None:
    done = run_program(REPLAY_CAPTURE=str(tmp_path / "snap"), REPLAY_CAPTURE_MAX_BYTES="60",
                       REPLAY_CAPTURE_STRICT="1")
    assert done.returncode == 0 and done.stdout.strip() == "[3.0, 3.0, 3.0]", done.stderr
    assert len(Snapshot(tmp_path / "snap")) == 2 and "the byte budget is spent" in done.stderr


UNCHANGED_PROGRAM = textwrap.dedent("""
    import os, subprocess, sys
    import torch, triton, triton.language as tl

    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

    x = torch.arange(8, dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu")
    out = torch.empty_like(x)
    double[(1,)](x, out, 8, BLOCK=8)
    child = "import os, sys; print('replay' in sys.modules, os.environ.get('REPLAY_CAPTURE'))"
    print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
""")


def test_replay_capture_records_a_program_that_never_imports_replay(tmp_path: Path) -> None:
    """kernel_replay.pth (installed beside replay) starts the recording before the program's first
    line: its Triton launch is a call, and the child it starts neither records nor loads replay."""
    (tmp_path / "prog.py").write_text(UNCHANGED_PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # replay's import sets it here
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, "REPLAY_CAPTURE": "snap"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None"]
    (record,) = Snapshot(tmp_path / "snap")
    assert record.op == "__main__.double" and record.variant == "triton"
    assert record.tensors["out/out_ptr"].tolist() == [2.0 * i for i in range(8)]


@pytest.mark.parametrize("argv, records", [
    (["python", "prog.py"], True),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "prog.py"], False),
    (["/venv/bin/python3", "/venv/bin/torchrun", "prog.py"], False),  # a console script: python runs it
])
def test_a_distributed_launcher_leaves_replay_capture_to_its_ranks(argv: list[str], records: bool,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import replay_autostart

    monkeypatch.setattr(sys, "orig_argv", argv)
    monkeypatch.setenv("REPLAY_CAPTURE", "snap")
    monkeypatch.setitem(sys.modules, "replay", None)  # an import that fails: said, not raised
    replay_autostart.start("here")
    assert ("REPLAY_CAPTURE" in os.environ) is not records  # taken by the process that records
    assert ("here: could not start recording: ModuleNotFoundError" in capsys.readouterr().err) is records


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU nothing is said: Triton compiles for it")
def test_triton_imported_before_replay_without_a_gpu_is_told_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "REPLAY_CAPTURE", "REPLAY_VERIFY")}
    done = subprocess.run([sys.executable, "-c", "import triton\nimport replay"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "import replay before triton, or set TRITON_INTERPRET=1" in done.stderr


def test_a_process_that_records_no_call_leaves_the_directory_to_the_program_after_it(tmp_path: Path) -> None:
    """REPLAY_CAPTURE exported, a helper Python run first (a `pip`, a script that launches no
    kernel) takes back the recording it started, so the program the variable was meant for finds
    the directory free."""
    helper = subprocess.run([sys.executable, "-c", "print('helper')"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "REPLAY_CAPTURE": "snap"})
    assert helper.returncode == 0 and helper.stdout.strip() == "helper", helper.stderr
    assert not (tmp_path / "snap").exists()
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "REPLAY_CAPTURE": "snap"})
    assert done.returncode == 0 and "not recording" not in done.stderr, done.stderr
    assert len(Snapshot(tmp_path / "snap")) == 3
