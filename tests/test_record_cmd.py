"""`replay record`'s options: refused before the program runs when malformed (exit 2, naming the option)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli import main
from user_shell import shell


@pytest.mark.parametrize("option, value", [("--max-bytes", "12Q"), ("--calls", "5:2"), ("--only", "a,,b")])
def test_a_malformed_option_is_exit_2_naming_it(tmp_path: Path, option: str, value: str) -> None:
    marker = tmp_path / "ran"
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "snap"), option, value, "--",
                                       "python", "-c", f"open({str(marker)!r}, 'w')"])
    assert result.exit_code == 2 and option in result.output and value in result.output, result.output
    assert not marker.exists()  # the program never started


def test_the_recorded_program_gets_ctrl_c_and_its_children_do_not_load_replay(tmp_path: Path) -> None:
    program = ("import signal, subprocess, sys\n"
               "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
               "child = 'import sys; print(\"replay\" in sys.modules)'\n"
               "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n")
    (tmp_path / "prog.py").write_text(program)
    done = shell("replay record -o snap -- python prog.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]  # Ctrl-C raises in it as usual; its child is left alone
