"""`replay record`'s options: refused before the program runs when malformed (exit 2, naming the option)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli import main


@pytest.mark.parametrize("option, value", [("--max-bytes", "12Q"), ("--calls", "5:2"), ("--only", "a,,b")])
def test_a_malformed_option_is_exit_2_naming_it(tmp_path: Path, option: str, value: str) -> None:
    marker = tmp_path / "ran"
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "snap"), option, value, "--",
                                       "python", "-c", f"open({str(marker)!r}, 'w')"])
    assert result.exit_code == 2 and option in result.output and value in result.output, result.output
    assert not marker.exists()  # the program never started
