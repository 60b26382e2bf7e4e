"""A Triton kernel library that knows nothing of kernel-replay, recorded with `replay record` only,
as README.md's "Record a program you did not write" teaches it.

The library (tests/thirdparty_project/) has two kernels, one autotuned and one taking position_buf,
a program (serve.py) with no import of replay, a tag v1.0 and an off-by-one mask planted later.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from thirdparty_project.history import OFF_BY_ONE, build
from user_project.history import Project
from user_shell import fenced, run_as_written, shell, user_env

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Record a program you did not write"
SCALE, APPEND = "tinylib.kernels.scale_rows_kernel", "tinylib.kernels.append_kv_kernel"


def readme_lines(title: str = SECTION) -> list[str]:
    text = README.read_text()
    start = text.index(title)
    section = text[start:text.find("\n## ", start + len(title))]
    return [line for block in fenced(section, "bash") for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """tinylib before the planted mask, its serve.py recorded into snapshots/serve_001."""
    project = build(tmp_path_factory.mktemp("lib") / "tinylib", upto="docs")
    done = shell("replay record -- python serve.py", project.path)
    assert done.returncode == 0, done.stderr
    return project


def edited_copy(project: Project, tmp_path: Path, old: str, new: str) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(project.path / "tinylib", copy / "tinylib")
    kernels = copy / "tinylib" / "kernels.py"
    text = kernels.read_text()
    assert text.count(old) == 1, old
    kernels.write_text(text.replace(old, new))
    return copy


def test_replay_record_keeps_every_launch_with_its_grid_and_config(good: Project) -> None:
    snapshot = good.path / "snapshots" / "serve_001"
    show = shell(f"replay show {snapshot} --json -", good.path)
    assert show.returncode == 0, show.stderr
    calls = json.loads(show.stdout)["calls"]
    assert [c["op"] for c in calls] == [SCALE, APPEND] * 3  # three decode steps, launches in order
    scale, append = calls[0], calls[1]
    chosen = scale["triton"]["autotune"]["BLOCK"]  # on a GPU the faster config, in the interpreter the only one
    assert scale["triton"]["grid"] == [2] and chosen in (16, 32)
    assert scale["args"]["BLOCK"] == chosen  # launched with the config chosen
    assert {(t["role"], t["name"]) for t in scale["tensors"]} == {
        ("in", "x_ptr"), ("in", "scale_ptr"), ("in", "out_ptr"), ("out", "out_ptr")}  # what it writes, after
    assert ("state", "position_buf") in {(t["role"], t["name"]) for t in append["tensors"]}
    assert ("out", "cache_ptr") in {(t["role"], t["name"]) for t in append["tensors"]}
    assert ("out", "position_buf") not in {(t["role"], t["name"]) for t in append["tensors"]}  # only read
    assert f"launch  grid (2); autotuned: BLOCK={chosen}" in shell(f"replay show {snapshot}", good.path).stdout


def test_an_off_by_one_mask_is_named_by_call_kernel_rows_and_element(good: Project, tmp_path: Path) -> None:
    edited = edited_copy(good, tmp_path, OFF_BY_ONE[1], OFF_BY_ONE[2])
    done = shell(f"replay run snapshots/serve_001 --code {edited} --json -", good.path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    failing = [c for c in report["calls"] if not c["passed"]]
    # on a GPU the autotuner's timing runs of the first scale_rows wrote out_ptr before the launch
    # recorded, so its unwritten column already held the right values: that launch saw no harm
    assert {c["op"] for c in failing} == {SCALE}
    assert [c["index"] for c in failing] == ([2, 4] if torch.cuda.is_available() else [0, 2, 4])
    detail = " ".join(json.dumps(failing[0]).split())
    assert "'out_ptr' differs in 2/64 elements; rows 0-1 of 2 wrong; first at [0, 31]" in detail  # the last column of each row
    assert report["first_divergence"]["rows"] == [0, 1]  # a kernel's rows: its outputs' leading axis


def test_replay_ptx_compiles_the_recorded_launches_and_names_what_each_reads(good: Project) -> None:
    done = shell("replay ptx --snapshot snapshots/serve_001 --code . --json -", good.path)
    assert done.returncode == 0, done.stderr
    kernels = {kernel["name"]: kernel for kernel in json.loads(done.stdout)["kernels"]}
    assert set(kernels) == {"scale_rows_kernel", "append_kv_kernel"}  # each once, however many launches
    assert kernels["append_kv_kernel"]["arguments_read"] == ["k_ptr", "position_buf"]
    assert kernels["scale_rows_kernel"]["params_written"] == ["out_ptr"]


@pytest.mark.parametrize("call, edited, code", [(1, False, 0), (2, True, 1)])
def test_a_launch_reproduces_without_kernel_replay(good: Project, tmp_path: Path, bare_python: Path, call: int,
                                                   edited: bool, code: int) -> None:
    """append_kv (position_buf) as recorded; scale_rows (autotuned) with the off-by-one mask in the code given."""
    given = edited_copy(good, tmp_path, OFF_BY_ONE[1], OFF_BY_ONE[2]) if edited else good.path
    out = tmp_path / "repro"
    made = shell(f"replay repro snapshots/serve_001 --call {call} -o {out} --code {given}", good.path)
    assert made.returncode == code, made.stdout + made.stderr
    assert json.loads((out / "call.json").read_text())["kind"] == "triton"
    ran = subprocess.run([str(bare_python), str(out / "repro.py")], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert ran.returncode == code, ran.stdout + ran.stderr
    assert ("out_ptr: DIFFERS (bits differ)" if edited else "cache_ptr: agrees (bitwise equal)") in ran.stdout


def test_propagated_replay_of_launches_holds_them_to_the_recording(good: Project, tmp_path: Path) -> None:
    """No reference names these kernels: the recording is the oracle of each launch along the chain."""
    clean = shell("replay run snapshots/serve_001 --propagate --code . --json -", good.path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert all(c["verdict"] == "ok" for c in json.loads(clean.stdout)["calls"])
    edited = edited_copy(good, tmp_path, OFF_BY_ONE[1], OFF_BY_ONE[2])
    done = shell(f"replay run snapshots/serve_001 --propagate --code {edited} --json -", good.path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["culprit"] == (2 if torch.cuda.is_available() else 0)  # as the plain replay's first failure
    assert {c["op"] for c in report["calls"] if c["verdict"] == "own error"} == {SCALE}


def test_a_kernel_gone_from_the_code_is_untestable_and_says_what_was_looked_for(good: Project, tmp_path: Path) -> None:
    edited = edited_copy(good, tmp_path, "def append_kv_kernel(", "def append_rows_kernel(")
    done = shell(f"replay run snapshots/serve_001 --code {edited}", good.path)
    assert done.returncode == 125, done.stdout + done.stderr
    assert "module 'tinylib.kernels' has no Triton kernel 'append_kv_kernel'" in " ".join(done.stdout.split())


def test_a_module_gone_from_the_package_is_untestable(good: Project, tmp_path: Path) -> None:
    edited = edited_copy(good, tmp_path, "import torch\n", "import torch\n")
    (edited / "tinylib" / "kernels.py").unlink()
    done = shell(f"replay run snapshots/serve_001 --code {edited}", good.path)
    assert done.returncode == 125, done.stdout + done.stderr
    assert "module 'tinylib.kernels' is not in this code" in " ".join(done.stdout.split())


def test_a_snapshot_does_not_choose_the_code_it_runs(good: Project, tmp_path: Path) -> None:
    done = shell(f"replay run {good.path / 'snapshots' / 'serve_001'}", tmp_path)  # nothing trusted here
    assert done.returncode == 2 and "provider module 'tinylib.kernels' is not trusted" in done.stderr


@pytest.mark.slow
def test_the_readme_commands_as_written_find_the_planted_mask(tmp_path: Path) -> None:
    project = build(tmp_path / "tinylib")
    expected = [  # (what the line starts with, its exit code, what its output must say)
        ("replay record -- python serve.py", 0, f"recorded 6 calls into snapshots/serve_001: 3 {SCALE} 3 {APPEND}"),
        ("replay show snapshots/serve_001", 0, "grid (2); autotuned: BLOCK="),
        ("replay run snapshots/serve_001 --code .", 0, "all 6 calls passed"),
        ("replay ptx --snapshot snapshots/serve_001 --code .", 0, "k_ptr, position_buf"),
        ("replay bisect --good v1.0 --bad HEAD snapshots/serve_001", 0, f"First bad commit {project.commits['mask']}"),
    ]
    run_as_written(readme_lines(), expected, project.path)


LOCALISE = "## From a divergence to its cause"


@pytest.mark.slow
def test_the_readme_localisation_commands_as_written(tmp_path: Path) -> None:
    """Recorded at v1.0, replayed at HEAD (the mask drops each row's last column)."""
    from user_project.history import git

    project = build(tmp_path / "tinylib")
    git(project.path, "checkout", "-q", "v1.0")
    assert shell("replay record -- python serve.py", project.path).returncode == 0
    git(project.path, "checkout", "-q", "-")
    first = 2 if torch.cuda.is_available() else 0  # on a GPU the autotuner's runs pre-filled call 0's column
    expected = [
        ("replay graph snapshots/serve_001 --html graph.html", 0, "6 calls"),
        ("replay run snapshots/serve_001 --propagate --code .", 1, f"first call over its own tolerance: call {first}"),
        ("replay run snapshots/serve_001 --code . --html report.html", 1, "differs in 2/64 elements"),
        ("replay repro snapshots/serve_001 --call 0 -o call0 --code .", 1 if first == 0 else 0, "written to call0"),
        ("python call0/repro.py", 1 if first == 0 else 0, "out_ptr: "),
    ]
    run_as_written(readme_lines(LOCALISE), expected, project.path)
    assert (project.path / "graph.html").exists() and 'class="heatmap"' in (project.path / "report.html").read_text()


def test_the_recorded_program_runs_as_it_does_alone(good: Project) -> None:
    # alone, a machine with no GPU runs Triton in the interpreter only if told to (replay record tells it)
    interpreter = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    alone = subprocess.run(["python", "serve.py"], cwd=good.path, capture_output=True, text=True,
                           env={**user_env(), **interpreter})
    recorded = shell("replay record -o snapshots/again -- python serve.py", good.path)
    assert alone.returncode == 0 and recorded.returncode == 0, alone.stderr + recorded.stderr
    assert alone.stdout == recorded.stdout  # the program's own output, untouched
