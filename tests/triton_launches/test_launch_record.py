"""A recording of Triton launches (`replay record`'s calls) read as launch records
(replay/triton_launches/launch_record.py): `replay ptx --snapshot` compiles each kernel again for a
CUDA target from the call alone (its arguments' types, its constexprs, a dtype among them by name,
the autotune config chosen) and names the arguments it reads and writes; `replay trace` shows each
launch's kernel, grid and warps, and with --resources its registers. No GPU: Triton compiles PTX
on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import triton.language as tl
from click.testing import CliRunner

import replay
from replay.cli import main
from replay.snapshot import Snapshot

import door_kernels as k


def test_recorded_launches_compile_again_with_their_types_constexprs_and_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # a cache of its own: Triton keys "fp16" and tl.float16 alike, so a cached kernel would hide a
    # dtype compiled from its name
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.linspace(-2, 2, 40, device=device)
    with replay.recording(tmp_path / "snap"):
        k.cast_kernel[(3,)](x, torch.empty(40, dtype=torch.float16, device=device), 40, OUT_DTYPE=tl.float16,
                            BLOCK=16)
        k.tuned_kernel[(2,)](x, torch.empty_like(x), 40)
    done = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap"), "--provider", "door_kernels",
                                     "--json", "-"])
    assert done.exit_code == 0, done.output
    kernels = {kernel["name"]: kernel for kernel in json.loads(done.stdout)["kernels"]}
    assert set(kernels) == {"cast_kernel", "tuned_kernel"}
    cast, tuned = kernels["cast_kernel"], kernels["tuned_kernel"]
    assert cast["constexprs"] == {"OUT_DTYPE": "fp16", "BLOCK": 16} and tuned["constexprs"] == {"BLOCK": 16}
    assert (cast["params_read"], cast["params_written"]) == (["x_ptr"], ["out_ptr"])
    assert "cvt.rn.f16.f32" in open_ptx(tmp_path / "snap", "cast_kernel")  # compiled to store halves


def open_ptx(snapshot: Path, kernel: str) -> str:
    """The PTX `replay ptx` compiled for `kernel`, through the function the command uses."""
    from replay.ptx.sources import snapshot_ptx

    (source,) = [s for s in snapshot_ptx(snapshot, [90], ["door_kernels"]) if f".entry {kernel}" in s.text]
    return source.text


def test_a_kernel_the_trust_rule_does_not_name_is_not_compiled(tmp_path: Path, device: str) -> None:
    with replay.recording(tmp_path / "snap"):
        k.tuned_kernel[(2,)](torch.zeros(8, device=device), torch.empty(8, device=device), 8)
    done = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap")])
    assert done.exit_code == 2 and "provider module 'door_kernels' is not trusted" in done.output


def test_the_trace_shows_each_launch_and_its_resources_compiled_for_a_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))  # a dtype by name would fail to compile
    x = torch.linspace(-2, 2, 40, device=device)
    with replay.recording(tmp_path / "snap"):
        k.tuned_kernel[(3,)](x, torch.empty_like(x), 40)
        k.cast_kernel[(3,)](x, torch.empty(40, dtype=torch.float16, device=device), 40, OUT_DTYPE=tl.float16,
                            BLOCK=16)
        k.odd_names_kernel[(1,)](x, torch.empty_like(x), None, kernel=2, binds=3, block=16)
    done = CliRunner().invoke(main, ["trace", str(tmp_path / "snap"), "--resources", "sm_90",
                                     "--provider", "door_kernels", "--json", "-"])
    assert done.exit_code == 0, done.output
    tuned, cast, odd = [call["launches"][0] for call in json.loads(done.stdout)["calls"]]
    assert (tuned["kernel"], tuned["grid"], tuned["num_warps"], tuned["constexprs"]) == \
        ("tuned_kernel", [3], 4, {"BLOCK": 16})  # warps: the autotune config's
    assert odd["constexprs"] == {"scale": None, "kernel": 2, "binds": 3, "block": 16} and odd["kernel"] == "odd_names_kernel"
    for launch in (tuned, cast, odd):  # on a GPU the recording has them from the kernel it ran
        assert launch["registers"] > 0
        assert launch.get("resources_from") == (None if device == "cuda" else "compiled for sm_90 (no GPU)")


def test_kernels_on_a_class_or_made_in_a_function_are_compiled_where_an_import_finds_them(tmp_path: Path,
                                                                                         device: str) -> None:
    x = torch.arange(16.0, device=device)
    with replay.recording(tmp_path / "snap"):
        k.Kernels.nested[(1,)](x, torch.empty_like(x), BLOCK=16)
        k.made_in_a_function()[(1,)](x.clone(), BLOCK=16)
    done = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap"), "--provider", "door_kernels",
                                     "--json", "-"])
    assert done.exit_code == 0, done.output
    (nested,) = json.loads(done.stdout)["kernels"]  # the one made in a function: shown by trace, not compiled
    assert nested["name"] == "nested" and nested["params_read"] == ["x_ptr"] and nested["params_written"] == ["out_ptr"]


TWO_KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def good_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


@triton.jit
def later_broken_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
'''


def test_a_kernel_that_no_longer_compiles_is_its_own_row_and_the_others_are_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "two_kernels_49.py").write_text(TWO_KERNELS)
    kernels = importlib.import_module("two_kernels_49")
    x = torch.arange(16.0, device=device)
    with replay.recording(tmp_path / "snap"):
        kernels.good_kernel[(1,)](x, torch.empty_like(x), 16, BLOCK=16)
        kernels.later_broken_kernel[(1,)](x, torch.empty_like(x), 16, BLOCK=16)
    (tmp_path / "two_kernels_49.py").write_text(TWO_KERNELS.replace("* 2", "* tl.no_such_thing"))
    code = ["--code", str(tmp_path)]
    done = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap"), *code, "--json", "-"])
    assert done.exit_code == 2, done.output  # bad input, said, after the others were checked
    report = json.loads(done.stdout)
    assert [kernel["name"] for kernel in report["kernels"]] == ["good_kernel"]
    (uncompiled,) = report["uncompiled"]
    assert "two_kernels_49.later_broken_kernel for sm_90" in uncompiled["error"]
    assert "no_such_thing" in uncompiled["error"]
    assert "did not compile: two_kernels_49.later_broken_kernel" in done.stderr
    done = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap"), *code, "--kernel", "good*",
                                     "--json", "-"])
    assert done.exit_code == 0 and json.loads(done.stdout)["uncompiled"] == [], done.output  # filtered out
    done = CliRunner().invoke(main, ["trace", str(tmp_path / "snap"), "--resources", "sm_90", *code, "--json", "-"])
    assert done.exit_code == 0, done.output
    good, broken = [call["launches"][0] for call in json.loads(done.stdout)["calls"]]
    assert good["registers"] > 0
    if device != "cuda":  # on a GPU the recording has them from the kernel it ran: nothing compiled
        assert broken["registers"] is None and broken["resources_from"].startswith("did not compile: two_kernels_49")
        assert "--resources: two_kernels_49.later_broken_kernel" in done.stderr


def test_ptx_from_a_record_is_specialised_as_the_launch_was(tmp_path: Path, device: str) -> None:
    """An int argument of 1 compiled in as a constant, ints divisible by 16 and aligned pointers
    known so: Triton's own launch specialises on them (vectorised loads follow), and the PTX of a
    record must be that binary's; a parameter marked do_not_specialize stays a parameter."""
    x = torch.arange(2048.0, device=device)  # 8 elements a thread: room for 4-wide loads
    with replay.recording(tmp_path / "snap"):
        k.strided_copy_kernel[(1,)](x, torch.empty(1024, device=device), 1, 1024, BLOCK=1024)
        k.strided_copy_kernel[(1,)](x, torch.empty(1024, device=device), 2, 1024, BLOCK=1024)
        k.unspecialised_copy_kernel[(1,)](x, torch.empty(1024, device=device), 1, 1024, BLOCK=1024)
        k.annotated_copy_kernel[(1,)](x, torch.empty(1024, device=device), 1, 1024, BLOCK=1024)
    from replay.ptx.sources import snapshot_ptx

    contiguous, strided, unspecialised, annotated = snapshot_ptx(tmp_path / "snap", [90], ["door_kernels"])
    assert ".param .u32 strided_copy_kernel_param_2" in contiguous.text  # n: stride compiled in as 1
    assert list(contiguous.param_names.values())[:3] == ["x_ptr", "out_ptr", "n"]
    assert "ld.global.v4" in contiguous.text and "ld.global.v4" not in strided.text
    assert list(strided.param_names.values())[:4] == ["x_ptr", "out_ptr", "stride", "n"]
    assert list(unspecialised.param_names.values())[:4] == ["x_ptr", "out_ptr", "stride", "n"]
    assert "ld.global.v4" not in unspecialised.text
    assert list(annotated.param_names.values())[:4] == ["x_ptr", "out_ptr", "stride", "n"]
    if device == "cuda":  # the binary that ran reported its registers: the record's compile is that binary
        ran = [call.triton["compiled"]["registers"] for call in Snapshot(tmp_path / "snap")]
        assert [contiguous.registers, strided.registers, unspecialised.registers, annotated.registers] == ran
