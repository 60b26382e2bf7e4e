"""A snapshot's Triton and torch-op calls are data: what they may name is checked before anything
runs, and what cannot be made is bad input (exit 2) or untestable (125), never a divergence."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from replay.cli import main
from replay.snapshot import SnapshotWriter
from user_shell import shell


def crafted(path: Path, op: str, variant: str, provider: str | None, args: list[dict], extra: dict,
            tensors: dict[str, torch.Tensor]) -> Path:
    writer = SnapshotWriter(path)
    writer.write_tensors(0, {"op": op, "variant": variant, "provider": provider, "args": args, "returns_json": {},
                             "launch": [], "meta": {}, **extra}, tensors)
    writer.close()
    return path


def run(path: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", str(path), *options])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("options, says", [
    ({"ir_override": "/tmp/evil.ptx"}, "launch option(s) 'ir_override' are not relaunched"),
    ({"num_warps": "4"}, "launch option(s) 'num_warps' have values of the wrong type"),
])
def test_launch_options_that_could_choose_the_code_are_refused(tmp_path: Path, options: dict, says: str) -> None:
    x = torch.ones(16)
    snap = crafted(tmp_path / "snap", "writes_cases.plain", "triton", "writes_cases",
                   [{"name": "x_ptr", "tensor": "in/x_ptr"}, {"name": "out_ptr", "tensor": "in/out_ptr"},
                    {"name": "n", "json": 16}, {"name": "BLOCK", "json": 16}],
                   {"triton": {"qualname": "plain", "grid": [1], "options": options}},
                   {"in/x_ptr": x, "in/out_ptr": x.clone(), "out/out_ptr": x * 2})
    code, said = run(snap, "--provider", "writes_cases")
    assert code == 2 and says in said


def test_a_typed_torch_op_argument_that_names_nothing_is_bad_input(tmp_path: Path) -> None:
    x = torch.ones(4)
    snap = crafted(tmp_path / "snap", "aten.sum.dim_IntList", "torch", None,
                   [{"name": "self", "tensor": "in/self"}, {"name": "dim", "json": [0]},
                    {"name": "dtype", "json": "torch.load"}],  # a torch attribute, but no dtype
                   {"torch_op": {"typed": {"dtype": "dtype"}, "lists": {}}},
                   {"in/self": x, "out/out": x.sum(0, keepdim=False)})
    code, said = run(snap)
    assert code == 2 and "'torch.load' is no dtype" in said


def test_a_kernel_in_the_programs_own_script_is_untestable_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(
        "import torch, triton, triton.language as tl\n\n\n"
        "@triton.jit\ndef twice(x_ptr, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2)\n\n\n"
        "twice[(1,)](torch.ones(16, device='cuda' if torch.cuda.is_available() else 'cpu'), BLOCK=16)\n")
    assert shell("replay record -o snap -- python script.py", tmp_path).returncode == 0
    done = shell("replay run snap", tmp_path)
    assert done.returncode == 125 and "defined in the recorded program's own script" in " ".join(done.stdout.split())
    compiled = shell("replay ptx --snapshot snap --code .", tmp_path)  # never `import __main__`: it is no module
    assert compiled.returncode == 2 and "defined in the program's own script" in " ".join(compiled.stderr.split())


def test_an_argument_no_launch_passes_leaves_the_launch_shown_and_uncompiled(tmp_path: Path) -> None:
    x = torch.ones(16)
    snap = crafted(tmp_path / "snap", "writes_cases.plain", "triton", "writes_cases",
                   [{"name": "x_ptr", "tensor": "in/x_ptr"}, {"name": "out_ptr", "tensor": "in/out_ptr"},
                    {"name": "n", "json": "sixteen"}, {"name": "BLOCK", "json": 16}],  # Triton takes no str
                   {"triton": {"qualname": "plain", "grid": [1], "constexprs": ["BLOCK"]}},
                   {"in/x_ptr": x, "in/out_ptr": x.clone(), "out/out_ptr": x * 2})
    traced = CliRunner().invoke(main, ["trace", str(snap), "--resources", "sm_90", "--provider", "writes_cases"])
    assert traced.exit_code == 0 and "plain" in traced.output  # shown, its registers unknown
    compiled = CliRunner().invoke(main, ["ptx", "--snapshot", str(snap), "--provider", "writes_cases"])
    assert compiled.exit_code == 2 and "no launch record says how to compile its kernel" in compiled.stderr
