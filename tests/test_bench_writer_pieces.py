"""scripts/bench_writer_pieces.py: a writer's per-piece Python for a store of many pieces, timed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_small_store_is_timed_and_reported() -> None:
    done = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "bench_writer_pieces.py"), "--pieces", "64",
                           "--changed", "3", "--repeat", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"64 pieces, 3 changed: \d+\.\d\d ms a store\n", done.stdout)
