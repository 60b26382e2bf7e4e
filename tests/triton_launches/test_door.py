"""The door every Triton launch passes while a recording is active (replay/triton_launches/door.py):
there only while recording, one call a launch, none for the autotuner's timing runs or for a
launch a registered op makes, and the launch's constexprs and filters kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import replay
from replay.cli import main
from replay.snapshot.reader import Snapshot
from replay.triton_launches import door, relaunch

import door_kernels as k

DOUBLE = "writes_cases.plain"


def recorded_ops(path: Path) -> list[str]:
    return [call.op for call in Snapshot(path)]


def replayed(path: Path) -> dict:
    trusted = ["--provider", "door_kernels", "--provider", "writes_cases"]
    result = CliRunner().invoke(main, ["run", str(path), *trusted, "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_door_is_there_only_while_recording(tmp_path: Path, device: str) -> None:
    own = JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"]
    with replay.recording(tmp_path / "snap"):
        assert door.installed() and JITFunction.__dict__["run"] is not own[0]
        k.double(torch.ones(20, device=device))
    assert not door.installed()
    assert (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"]) == own  # Triton's own, untouched
    k.double(torch.ones(20, device=device))  # and launches still work


def test_every_launch_is_a_call_with_its_grid_and_what_it_wrote(tmp_path: Path, device: str) -> None:
    x = torch.arange(20.0, device=device)
    with replay.recording(tmp_path / "snap"):
        out = k.double(x)
    (call,) = Snapshot(tmp_path / "snap")
    assert call.op == DOUBLE and call.variant == "triton" and call.provider == "writes_cases"
    assert call.triton["grid"] == [2] and call.triton["constexprs"] == ["BLOCK"]
    assert torch.equal(call.role("out")["out_ptr"].to(device), out)
    assert replayed(tmp_path / "snap")["passed"]


def test_a_launch_inside_a_registered_op_is_that_calls(tmp_path: Path, device: str) -> None:
    with replay.recording(tmp_path / "snap"):
        k.doubled_by_triton(torch.ones(20, device=device))
    assert recorded_ops(tmp_path / "snap") == ["door_kernels.doubled"]  # not the kernel a second time


def test_the_autotuners_timing_runs_are_not_calls(tmp_path: Path, device: str) -> None:
    k.benchmarked.clear()
    x = torch.arange(40.0, device=device)
    with replay.recording(tmp_path / "snap"):
        out = torch.empty_like(x)
        k.tuned_kernel[(3,)](x, out, x.numel())
    assert len(k.benchmarked) == 2  # both configs timed, through the door, unrecorded
    (call,) = Snapshot(tmp_path / "snap")
    assert call.triton["autotune"]["BLOCK"] == 16  # the first of two equal timings
    assert call.arguments()["BLOCK"] == 16
    assert replayed(tmp_path / "snap")["passed"]


def test_a_dtype_constexpr_travels_as_its_name_and_replays(tmp_path: Path, device: str) -> None:
    import triton.language as tl
    x = torch.linspace(-2, 2, 20, device=device)
    with replay.recording(tmp_path / "snap"):
        out = torch.empty(20, device=device, dtype=torch.float16)
        k.cast_kernel[(2,)](x, out, 20, OUT_DTYPE=tl.float16, BLOCK=16)
    (call,) = Snapshot(tmp_path / "snap")
    assert call.arguments()["OUT_DTYPE"] == "fp16" and call.triton["dtypes"] == {"OUT_DTYPE": "fp16"}
    (replay_of_call,) = replayed(tmp_path / "snap")["calls"]
    checks = {(c["kind"], c["variant"], c["name"]): c["passed"] for c in replay_of_call["checks"]}
    assert checks == {("vs-recorded", "triton", "out_ptr"): True,  # the relaunch, bitwise
                      ("vs-reference", "triton", "out_ptr"): True}  # and the reference the user named


def test_a_reference_named_for_a_kernel_that_disagrees_is_reported(tmp_path: Path, device: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import triton.language as tl
    x = torch.linspace(-2, 2, 20, device=device)
    with replay.recording(tmp_path / "snap"):
        k.cast_kernel[(2,)](x, torch.empty(20, device=device), 20, OUT_DTYPE=tl.float32, BLOCK=16)
    monkeypatch.setitem(relaunch._references, "door_kernels.cast_kernel",  # a wrong one, for this test only
                        lambda x_ptr, out_ptr, n, OUT_DTYPE, BLOCK: out_ptr.copy_(-x_ptr))
    trusted = ["--provider", "door_kernels", "--provider", "writes_cases"]
    result = CliRunner().invoke(main, ["run", str(tmp_path / "snap"), *trusted])
    assert result.exit_code == 1 and "'out_ptr' differs in 20/20 elements" in " ".join(result.output.split())


@pytest.mark.parametrize("options, kept", [
    ({"only": ("plain",)}, [DOUBLE] * 3),
    ({"skip": ("writes_cases.*",)}, ["door_kernels.cast_kernel"] * 3),
    ({"calls": (1, 2)}, [DOUBLE, "door_kernels.cast_kernel"]),  # the second launch of each kernel
    ({"triton": False}, []),
])
def test_filters_choose_the_launches_recorded(tmp_path: Path, device: str, options: dict, kept: list[str]) -> None:
    import triton.language as tl
    x = torch.ones(20, device=device)
    with replay.recording(tmp_path / "snap", **options):
        for _ in range(3):
            k.double(x)
            k.cast_kernel[(2,)](x, torch.empty_like(x), 20, OUT_DTYPE=tl.float32, BLOCK=16)
    assert recorded_ops(tmp_path / "snap") == kept


@pytest.mark.gpu
def test_a_launch_inside_a_cuda_graph_is_recorded_at_every_replay(tmp_path: Path) -> None:
    x = torch.zeros(20, device="cuda")  # the graph's input, filled before each replay
    fed = [torch.randn(20, device="cuda") for _ in range(3)]
    with replay.recording(tmp_path / "snap"):
        k.double(x)  # compiled, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = k.double(x)
        for values in fed:
            x.copy_(values)
            graph.replay()
    replays = [r for r in Snapshot(tmp_path / "snap") if "graph_replay" in r.meta]
    assert [(r.op, r.meta["graph_replay"]) for r in replays] == [(DOUBLE, n) for n in (1, 2, 3)]
    for call, values in zip(replays, fed):
        assert torch.equal(call.role("in")["x_ptr"], values.cpu())
        assert torch.equal(call.role("out")["out_ptr"], (values * 2).cpu())
        assert call.triton["grid"] == [2]
    assert torch.equal(out, fed[-1] * 2)
    assert replayed(tmp_path / "snap")["passed"]


def test_steps_a_program_marks_choose_the_launches_recorded(tmp_path: Path, device: str) -> None:
    now = replay.step()  # the counter is the process's: count from where it is
    x = torch.ones(20, device=device)
    with replay.recording(tmp_path / "snap", steps=(now + 2, now + 4)):
        for _ in range(5):
            marked = replay.step()
            k.double(x * marked)  # the input says which step launched it
    kept = [call.role("in")["x_ptr"][0].item() for call in Snapshot(tmp_path / "snap")]
    assert kept == [now + 2, now + 3]


def test_a_kernel_a_config_hook_launches_is_not_given_the_tuned_kernels_config(tmp_path: Path, device: str) -> None:
    x = torch.arange(20.0, device=device)
    with replay.recording(tmp_path / "snap"):
        k.hooked_kernel[(1,)](x, torch.empty_like(x), 20)
    hook_launch, tuned = Snapshot(tmp_path / "snap")
    assert (hook_launch.op, tuned.op) == (DOUBLE, "door_kernels.hooked_kernel")
    assert "autotune" not in hook_launch.triton and tuned.triton["autotune"]["BLOCK"] == 32


def test_an_autotuned_kernel_under_heuristics_keeps_its_config_and_replays(tmp_path: Path, device: str) -> None:
    x = torch.arange(20.0, device=device)
    with replay.recording(tmp_path / "snap"):
        k.tuned_heuristic_kernel[(1,)](x, torch.empty_like(x), 20)
    (call,) = Snapshot(tmp_path / "snap")
    assert call.triton["autotune"]["BLOCK"] == 32 and call.arguments()["EVEN"] is False  # 20 % 32
    assert replayed(tmp_path / "snap")["passed"]


def test_a_compiled_kernels_details_are_kept_once_it_is_loaded_and_given_as_copies() -> None:
    """A recording reads a compiled kernel's details once (at every launch it would cost ~25 us), but
    not before the kernel is loaded: its registers are counted only then."""
    from types import SimpleNamespace

    from replay.context import compiled_details

    compiled = SimpleNamespace(metadata=SimpleNamespace(num_warps=4, num_stages=3, shared=0, hash="h"))
    assert "registers" not in compiled_details(compiled)  # not loaded yet: read again next time
    compiled.n_regs = 32
    given = compiled_details(compiled)
    assert given == {"num_warps": 4, "num_stages": 3, "shared": 0, "hash": "h", "registers": 32}
    given["num_warps"] = 99  # a caller's header is its own
    compiled.metadata.num_warps = 8  # kept once loaded: not read again
    assert compiled_details(compiled)["num_warps"] == 4
