"""A user's code is found the same way by every command: `--code DIR` (packages and loose modules
alike, DIR first on the import path), `--provider MOD` (also from the current directory)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A loose module (a .py file, no package): a Triton kernel registered as an op, with an example and
# launch records that say how to compile it again.
TOY = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    import replay

    double = replay.op("toy_double", batch_axes={"x": 0, "out": 0})


    @triton.jit
    def _double_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < N) * 2, mask=offs < N)


    @double.single_and_batched
    def double_rows(x):
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), 64),)
        _double_kernel[grid](x, out, x.numel(), BLOCK=64)
        replay.record_launch("_double_kernel", grid, module=__name__, BLOCK=64, pointers={"x_ptr": x, "out_ptr": out},
                             signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "N": "i32", "BLOCK": "constexpr"})
        return out


    @double.reference
    def double_reference(x):
        return x * 2


    @double.example()
    def example(rows, dtype, device):
        return {"x": torch.arange(rows * 8, dtype=torch.float32, device=device).reshape(rows, 8)}
''')
RECORD = textwrap.dedent('''
    import sys
    import torch
    import replay
    import toykern

    with replay.recording(sys.argv[1]):
        toykern.double_rows(torch.ones(3, 8, device="cuda" if torch.cuda.is_available() else "cpu"))
''')
KV_MODEL = "from replay_kernels.kv_adapter import tiny as make\n"


def replay_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`replay ARGS` as a user runs it: the console script, from `cwd`, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(Path(sys.executable).with_name("replay")), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the loose module, a script that records with it (which must never run
    when replay looks for ops), and a snapshot it recorded."""
    root = tmp_path_factory.mktemp("project")
    (root / "toykern.py").write_text(TOY)
    (root / "record.py").write_text(RECORD + "open('RECORD-RAN', 'w')\n")
    done = subprocess.run([sys.executable, "record.py", "snap"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (root / "RECORD-RAN").unlink()
    return root


def test_code_dir_trusts_and_finds_a_loose_module(project: Path, tmp_path: Path) -> None:
    done = replay_cli("run", str(project / "snap"), "--code", str(project), cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_provider_is_found_in_the_current_directory(project: Path, tmp_path: Path) -> None:
    assert replay_cli("run", "snap", "--provider", "toykern", cwd=project).returncode == 0
    elsewhere = replay_cli("run", str(project / "snap"), "--provider", "toykern", cwd=tmp_path)
    assert elsewhere.returncode == 125
    assert "No module named 'toykern'" in elsewhere.stderr
    assert "give --code DIR for the tree that holds 'toykern'" in elsewhere.stderr


def test_an_untrusted_provider_in_the_current_directory_is_pointed_at(project: Path) -> None:
    done = replay_cli("run", "snap", cwd=project)
    assert done.returncode == 2
    assert "trust it with --code . (it is in the current directory) or --provider toykern" in done.stderr


def test_op_commands_find_ops_in_the_code_tree_without_running_its_scripts(project: Path, tmp_path: Path) -> None:
    done = replay_cli("invariance", "toy_double", "--code", str(project), "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ops"][0]["op"] == "toy_double"
    ptx = replay_cli("ptx", "toy_double", "--code", str(project), "--json", "-", cwd=tmp_path)
    assert ptx.returncode in (0, 1), ptx.stderr
    assert any(k["name"] == "_double_kernel" for k in json.loads(ptx.stdout)["kernels"])
    assert not (project / "RECORD-RAN").exists()


def test_trace_resources_compiles_kernels_from_the_code_tree(project: Path, tmp_path: Path) -> None:
    done = replay_cli("trace", str(project / "snap"), "--resources", "sm_90", "--code", str(project), "--json", "-",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (launch,) = json.loads(done.stdout)["calls"][0]["launches"]
    assert isinstance(launch["registers"], int) and "no GPU" in launch["resources_from"]


def test_kv_check_takes_its_model_from_the_code_tree(tmp_path: Path) -> None:
    tree = tmp_path / "engine"
    tree.mkdir()
    (tree / "my_engine.py").write_text(KV_MODEL)
    done = replay_cli("kv-check", "--model", "my_engine:make", "--code", str(tree), "--prompt-len", "2",
                      "--chunks", "N", "--decode-steps", "1", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"] is True
