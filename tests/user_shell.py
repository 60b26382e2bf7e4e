"""Commands run as a user types them: in a shell, this environment's bin first on PATH, none of the
test run's own settings (TRITON_INTERPRET, PYTHONPATH) inherited; and README code blocks to run."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def fenced(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def user_env() -> dict[str, str]:
    """A user's shell: this environment's bin first, no test settings (TRITON_INTERPRET) inherited."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PET_MASTER_PORT"] = str(free_port())  # torchrun's one default port, taken by tests side by side
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def shell(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(line, shell=True, cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=600)


def run_as_written(lines: list[str], expected: list[tuple[str, int, str]], cwd: Path) -> None:
    """Run README lines one by one in `cwd`; each must start as expected (what the line starts with,
    its exit code, what its output must say, blanks folded)."""
    assert len(lines) == len(expected), lines
    for line, (start, code, says) in zip(lines, expected):
        assert line.startswith(start), (line, start)
        done = shell(line, cwd)
        output = done.stdout + done.stderr
        assert done.returncode == code, (line, output)
        assert says in " ".join(output.split()), (line, output)
