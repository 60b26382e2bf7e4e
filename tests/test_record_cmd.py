"""`replay record`: its options refused before the program runs when malformed (exit 2, naming the option), its
default snapshot's name, signals passed on to the program."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.record_program import default_snapshot
from replay.snapshot import Snapshot
from user_shell import shell


@pytest.mark.parametrize("option, value", [("--max-bytes", "12Q"), ("--calls", "5:2"), ("--only", "a,,b"),
                                           ("--ring", "many"), ("--ring-bytes", "2Q")])
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


FLIGHT_PROGRAM = """
import sys
import torch
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


x = torch.zeros(16)
for step in range(10):
    add_one[(1,)](x, 16, BLOCK=16)
if sys.argv[1] == "crash":
    raise RuntimeError(f"step {step}: went wrong")
"""


@pytest.mark.parametrize("ending", ["crash", "clean"])
def test_a_flight_recording_of_an_unchanged_program_writes_its_last_calls_when_it_crashes(tmp_path: Path,
                                                                                          ending: str) -> None:
    (tmp_path / "prog.py").write_text(FLIGHT_PROGRAM)
    done = shell(f"replay record -o snap --ring 3 -- python prog.py {ending}", tmp_path)
    snapshot = Snapshot(tmp_path / "snap")
    if ending == "clean":
        assert done.returncode == 0, done.stderr
        assert len(snapshot) == 0 and "the flight recorder wrote nothing into snap" in done.stderr
        return
    assert done.returncode == 1 and "RuntimeError: step 9: went wrong" in done.stderr  # the program's own
    assert "the flight recorder wrote its last 3 calls into snap" in done.stderr
    assert [record.index for record in snapshot] == [7, 8, 9]
    assert [record.tensors["out/x_ptr"][0].item() for record in snapshot] == [8.0, 9.0, 10.0]



SIGNALLED_PROGRAM = FLIGHT_PROGRAM.split("if sys.argv")[0] + """
import time
from pathlib import Path
print("ready", flush=True)
index = Path(sys.argv[1]) / "calls.jsonl"
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (index.exists() and len(index.read_text().splitlines()) == 3):
    time.sleep(0.05)  # the dump is written on a thread of its own while the program goes on
add_one[(1,)](x, 16, BLOCK=16)
print("went on", flush=True)
"""


def test_sigusr1_sent_to_replay_record_makes_the_flight_recording_write_and_the_program_go_on(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(SIGNALLED_PROGRAM)
    recording = subprocess.Popen([sys.executable, "-m", "replay", "record", "-o", "snap", "--ring", "3", "--",
                                  sys.executable, "prog.py", str(tmp_path / "snap")], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert recording.stdout is not None
    assert recording.stdout.readline().strip() == "ready"
    recording.send_signal(signal.SIGUSR1)
    out, err = recording.communicate(timeout=120)
    assert recording.returncode == 0 and out.strip() == "went on", err
    assert [record.index for record in Snapshot(tmp_path / "snap")] == [7, 8, 9]  # the launch after it: not written
    assert "the flight recorder wrote its last 3 calls into snap" in err


@pytest.mark.parametrize("command, name", [
    (["python", "serve.py", "--port", "8"], "serve_001"),
    (["python3", "-u", "-X", "dev", "tools/serve.py"], "serve_001"),
    (["python", "-m", "pkg.serve"], "pkg.serve_001"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "train_001"),
    (["python", "-c", "import torch\nprint(torch.ones(2))"], "python_001"),  # the code is no folder's name
    (["./run me.sh"], "run_me.sh_001"),
    (["./serve.py", "--port", "8"], "serve_001"),
    (["python", "-X", "dev", "serve.py", "-m", "big"], "serve_001"),  # -X's value; the script's own -m
    (["accelerate", "launch", "--config_file", "cfg.yaml", "train.py"], "train_001"),
])
def test_the_default_snapshot_is_named_after_the_program(tmp_path: Path, command: list[str], name: str) -> None:
    assert default_snapshot(command, tmp_path) == tmp_path / name
    (tmp_path / name).mkdir()
    assert default_snapshot(command, tmp_path).name == name.replace("_001", "_002")  # the next number free


def test_a_recording_of_no_call_is_kept_for_replay_record_to_report(tmp_path: Path) -> None:
    done = shell("replay record -o snap -- python -c pass", tmp_path)
    assert done.returncode == 0 and "recorded 0 calls into snap" in done.stderr, done.stderr
    assert len(Snapshot(tmp_path / "snap")) == 0
