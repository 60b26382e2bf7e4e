"""Fixtures for bisect tests (helpers live in bisect_helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bisect_helpers import History, linear


@pytest.fixture
def make_linear(tmp_path: Path):
    counter = iter(range(1000))

    def make(n: int, bug_at: int, extra: dict[int, dict[str, str]] | None = None) -> History:
        return linear(tmp_path / f"repo{next(counter)}", n, bug_at, extra)
    return make
