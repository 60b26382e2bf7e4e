"""Ctrl-C at any moment of a command, while the harness still imports torch too: exit 130 and one
line on stderr, never a traceback (and never 1, which git bisect run reads as a bad commit)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPLAY = str(Path(sys.executable).with_name("replay"))


def interpreter_start() -> float:
    """Seconds this Python takes to start (site and .pth files) before any of a script's own code
    runs: a Ctrl-C then meets Python's default, not the harness, so the delays below come after it."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return 2 * (time.monotonic() - started)


@pytest.mark.parametrize("delay", [0.05, 0.4, 0.9, 1.5, 4.0])  # the imports take a second or two here
def test_ctrl_c_at_any_moment_is_exit_130_and_one_line(make_linear, delay: float) -> None:
    history = make_linear(8, bug_at=5)
    start = interpreter_start()
    child = subprocess.Popen([REPLAY, "bisect", "--good", history.shas[0], "--bad", "HEAD", "--run", "sleep 60"],
                             cwd=history.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(start + delay)
    child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert child.returncode == 130, stderr
    assert len(lines) == 1 and lines[0].startswith("replay: interrupted") and "Traceback" not in stderr, stderr


def test_an_import_broken_by_the_ctrl_c_is_exit_130_too(tmp_path: Path) -> None:
    # numpy interrupted mid-import raises ImportError, not KeyboardInterrupt: seen on the H100
    fake = tmp_path / "replay"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "cli.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
        "    raise ImportError('cannot load module more than once per process')\n")
    launcher = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-S", "-c", "import replay_launcher; replay_launcher.main()"],  # -S: no installed replay
                          cwd=tmp_path, env={"PYTHONPATH": str(launcher), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stderr == "replay: interrupted\n", done.stderr
