"""scripts/lock_tax.py, a diagnosis of what an operation costs its thread beside another that wants
the interpreter lock: on this machine (no GPU) the host's rows, each timed alone and beside."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lock_tax.py"


def test_each_operation_is_timed_alone_and_beside_a_thread_running_python() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--calls", "200"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    timed = {what.strip(): (float(alone), float(beside)) for what, alone, beside in rows[1:]}
    assert {"torch: view as bytes", "address, strides and offset read"} <= set(timed)
    assert all(alone > 0 and beside > 0 for alone, beside in timed.values())
