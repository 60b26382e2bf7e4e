"""`replay record -- COMMAND`: run a program unchanged with recording on from its first line.

The command runs as it would from a shell, with REPLAY_CAPTURE naming the snapshot and a
directory first on PYTHONPATH whose sitecustomize imports replay (replay/bootstrap/): its first
Python process records every registered call and every Triton launch, and writes the snapshot
out as it exits; under torchrun each rank records instead, into the snapshot's rank-<r>/. Ctrl-C
reaches the program, which stops and writes what it recorded; a SIGTERM sent to this process (by
`timeout`, a scheduler) is passed on to the program, which writes what it recorded and ends; this
process waits for it either way and then says what the snapshot holds. A SIGUSR1 is passed on too:
a flight recording (--ring) writes the calls it holds and the program goes on.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from replay import settings
from replay.errors import ReplayError, SnapshotError
from replay.ranks.layout import is_multi_rank, snapshot_members
from replay.snapshot import Snapshot
from replay.snapshot.writer import MANIFEST

BOOTSTRAP = Path(__file__).with_name("bootstrap")


@dataclass
class RecordedProgram:
    snapshot: Path
    exit_code: int
    recorded: bool  # a Python process of the command started the recording
    calls: collections.Counter[str] = field(default_factory=collections.Counter)  # op (kernel) -> calls
    capture_errors: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # a torchrun program: the ranks that recorded (rank-<r>/)


def default_snapshot(command: list[str], root: Path = Path("snapshots")) -> Path:
    """snapshots/<program>_NNN, the first number not taken, <program> in characters a folder's name
    may hold anywhere (_program_name)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", _program_name(command)).strip("._-") or "program"
    for number in range(1, 10_000):
        candidate = root / f"{stem}_{number:03d}"
        if not candidate.exists():
            return candidate
    raise ReplayError(f"{root}: {stem}_001 to {stem}_9999 are all taken; give -o DIR")


def _program_name(command: list[str]) -> str:
    """What a command runs: for Python, `pkg.mod` of `-m pkg.mod`, `prog` of its script (`python -X
    dev prog.py`), or `python` for `-c CODE`; for any other command (`torchrun --nproc-per-node 2
    train.py`, `./serve.py`), the first .py script it names, else the module after its `-m`, else
    its own name."""
    first = Path(command[0])
    if first.name.startswith("python"):
        words = iter(command[1:])
        for word in words:
            if word == "-m":
                return next(words, first.name)
            if word == "-c":
                return first.name
            if word in _VALUED_OPTIONS:
                next(words, None)
            elif not word.startswith("-"):
                return Path(word).stem
        return first.name
    script = next((word for word in command if word.endswith(".py")), None)
    if script is not None:
        return Path(script).stem
    return command[command.index("-m") + 1] if "-m" in command[:-1] else first.name


_VALUED_OPTIONS = ("-X", "-W", "--check-hash-based-pycs")  # the interpreter's options that take a value


def record_program(command: list[str], snapshot: Path, environment: dict[str, str]) -> RecordedProgram:
    """Run `command` recording into `snapshot` (which must not hold a snapshot yet), with the
    REPLAY_CAPTURE_* `environment` options; return its exit code and what was recorded."""
    if not command:
        raise ReplayError("no command to record: give it after --, e.g. replay record -- python prog.py")
    if shutil.which(command[0]) is None:
        raise ReplayError(f"{command[0]}: command not found")
    if (snapshot / MANIFEST).exists() or is_multi_rank(snapshot):
        raise SnapshotError(f"{snapshot}: already holds a snapshot; record into a new directory")
    path = [str(BOOTSTRAP), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, **environment, "REPLAY_CAPTURE": str(snapshot.resolve()), "PYTHONPATH": os.pathsep.join(path),
           settings.RUN_ID.name: uuid.uuid4().hex}  # shared by a torchrun program's ranks, told from other runs
    # Ctrl-C is the program's (it stops and writes): this process waits it out. A handler, not
    # SIG_IGN, which the program would inherit through exec and never see a Ctrl-C at all. A
    # SIGTERM is sent to this process alone: passed on, the program writes and ends, then this says so;
    # a SIGUSR1 too (a flight recording writes what it holds and goes on)
    running: list[subprocess.Popen] = []

    def pass_on(number: int, frame: object) -> None:
        for program in running:
            program.send_signal(number)
    previous = {number: signal.signal(number, handler) for number, handler in
                ((signal.SIGINT, lambda number, frame: None), (signal.SIGTERM, pass_on), (signal.SIGUSR1, pass_on))}
    try:
        with subprocess.Popen(command, env=env) as program:
            running.append(program)
            exit_code = program.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    result = RecordedProgram(snapshot, 128 - exit_code if exit_code < 0 else exit_code,
                             recorded=(snapshot / MANIFEST).exists() or is_multi_rank(snapshot))
    for rank, member in (snapshot_members(snapshot) if result.recorded else {}).items():
        opened = Snapshot(member, strict=False)
        result.calls.update(entry.op for entry in opened.entries)
        said = f"rank {rank}: " if rank is not None else ""
        result.capture_errors += [said + error for error in opened.manifest.get("capture_errors", [])]
        result.ranks += [rank] if rank is not None else []
    return result
