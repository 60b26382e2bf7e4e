"""The harness type-checks: mypy over replay/ at the strictness pyproject.toml sets ([tool.mypy]), no
error, no blanket ignore; the package ships py.typed, so a user's checker reads its types too."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_replay_type_checks_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (ROOT / "replay" / "py.typed").is_file()
