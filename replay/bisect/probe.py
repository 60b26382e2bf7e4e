"""Running one probe in a worktree and reading its verdict from the exit code.

Exit 0 good, 1 bad, 125 skip (cannot be tested); anything else, a signal or a
timeout is a skip too, with the reason kept. Every probe runs in its own session
so a timeout or Ctrl-C can kill its whole process tree.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import replay
from replay.bisect.search import BAD, GOOD, SKIP
from replay.errors import EXIT_DIVERGED, EXIT_PASS, EXIT_UNTESTABLE

TAIL_LINES = 20
TAIL_CHARS = 4000

# The harness's own source root: the engine probe imports `replay` from here, never
# from the worktree, so the harness stays fixed while the kernels under test vary.
HARNESS_ROOT = Path(replay.__file__).resolve().parent.parent


@dataclass(frozen=True)
class ProbeCommand:
    """What a probe runs: the replay engine on a snapshot, or a shell line (`--run`).

    The engine runs from `neutral_dir` so `python -m replay` cannot pick up a
    `replay/` package inside the worktree; a shell line runs inside the worktree.
    """

    label: str  # shown in logs
    snapshot: Path | None = None
    shell_line: str | None = None
    options: tuple[str, ...] = ()  # `replay run` options every probe takes (--provider MOD, --readable)
    oracle: tuple[str, ...] = ()  # `replay run`'s options that say what a commit is checked against
    # what the oracle options mean, for the cache: a path of this run's own (a good end's outputs)
    # is said by what it holds, so that a later run finds the same key
    oracle_identity: str = ""

    @classmethod
    def engine(cls, snapshot: Path, options: tuple[str, ...] = (), oracle: tuple[str, ...] = (),
               oracle_identity: str | None = None) -> ProbeCommand:
        said = _flags(oracle)
        return cls(label=f"replay run {snapshot} --code WORKTREE{said}{_flags(options)} --json -",
                   snapshot=snapshot, options=options, oracle=oracle,
                   oracle_identity=said if oracle_identity is None else oracle_identity)

    @classmethod
    def shell(cls, line: str, snapshot: Path | None = None) -> ProbeCommand:
        return cls(label=line, snapshot=snapshot, shell_line=line)

    @property
    def identity(self) -> str:
        """What the cache keys on: the shell line, or the engine (its snapshot is keyed by digest)."""
        if self.shell_line is not None:
            return self.shell_line
        return f"replay run --json{self.oracle_identity}{_flags(self.options)}"

    def invocation(self, worktree: Path, neutral_dir: Path) -> Invocation:
        if self.shell_line is not None:
            return Invocation(self.shell_line, worktree, {})
        assert self.snapshot is not None
        pythonpath = os.pathsep.join(p for p in (str(HARNESS_ROOT), os.environ.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "replay", "run", str(self.snapshot), *self.oracle, *self.options,
                "--code", str(worktree), "--json", "-"]
        return Invocation(argv, neutral_dir, {"PYTHONPATH": pythonpath})


def _flags(options: tuple[str, ...]) -> str:
    return "".join(f" {o}" for o in options)


@dataclass(frozen=True)
class Invocation:
    args: list[str] | str  # a string runs in the shell
    cwd: Path
    env: dict[str, str]  # on top of the caller's environment


@dataclass(frozen=True)
class ProbeOutcome:
    verdict: str  # good, bad or skip
    exit_code: int | None  # None when it never finished (timeout, failed to start)
    reason: str
    seconds: float
    report: dict[str, Any] | None  # the JSON object the probe printed on stdout, if any
    output_tail: str  # the last lines of its output (stderr only when a report was read)

    @property
    def deterministic(self) -> bool:
        """Worth caching: a verdict, or an explicit 'cannot be tested' (125)."""
        return self.exit_code in (EXIT_PASS, EXIT_DIVERGED, EXIT_UNTESTABLE)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeOutcome:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def verdict_for(exit_code: int) -> tuple[str, str]:
    """(verdict, reason) for a probe's exit status (negative: killed by that signal)."""
    if exit_code == EXIT_PASS:
        return GOOD, "exit 0"
    if exit_code == EXIT_DIVERGED:
        return BAD, "exit 1"
    if exit_code == EXIT_UNTESTABLE:
        return SKIP, "exit 125: cannot be tested"
    if exit_code < 0:
        return SKIP, f"killed by {signal.Signals(-exit_code).name}"
    return SKIP, f"exit {exit_code}: not a verdict (0 good, 1 bad, 125 skip)"


class ProbeRunner:
    """Runs probes (from any thread) and kills every one still running on cancel()."""

    def __init__(self, timeout: float | None, neutral_dir: Path) -> None:
        self.timeout = timeout
        self.neutral_dir = neutral_dir
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._cancelled = False

    def run(self, command: ProbeCommand, worktree: Path, sha: str, device: str | None = None) -> ProbeOutcome:
        call = command.invocation(worktree, self.neutral_dir)
        env = {**os.environ, **call.env, "REPLAY_BISECT_COMMIT": sha, "REPLAY_BISECT_WORKTREE": str(worktree)}
        if command.snapshot is not None:
            env["REPLAY_SNAPSHOT"] = str(command.snapshot)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        start = time.monotonic()
        with self._lock:
            if self._cancelled:
                return ProbeOutcome(SKIP, None, "cancelled", 0.0, None, "")
            try:
                proc = subprocess.Popen(call.args, shell=isinstance(call.args, str), cwd=call.cwd, env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
            except OSError as exc:
                return ProbeOutcome(SKIP, None, f"could not start: {exc}", 0.0, None, "")
            self._live.add(proc)
        try:
            try:
                stdout, stderr = proc.communicate(timeout=self.timeout)
                verdict, reason = verdict_for(proc.returncode)
                exit_code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                stdout, stderr = proc.communicate()
                verdict, reason, exit_code = SKIP, f"timed out after {self.timeout:g} s", None
        finally:
            with self._lock:
                self._live.discard(proc)
        seconds = time.monotonic() - start
        report = parse_report(stdout.decode(errors="replace"))
        tail_source = stderr if report is not None else stdout + stderr
        return ProbeOutcome(verdict, exit_code, reason, round(seconds, 3), report,
                            tail(tail_source.decode(errors="replace")))

    def cancel(self) -> None:
        """Kill every running probe and refuse new ones (Ctrl-C, SIGTERM)."""
        with self._lock:
            self._cancelled = True
            for proc in self._live:
                _kill_tree(proc)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def parse_report(stdout: str) -> dict[str, Any] | None:
    """The JSON object a probe printed: all of stdout, or else its last line that is one."""
    text = stdout.strip()
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):  # not a report, or one nested too deep to be ours
            continue
        if isinstance(value, dict):
            return value
    return None


def tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]
