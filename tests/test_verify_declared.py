"""A library's plain function decorated in the program, not in its own module (replay.verify with
a reference, replay.capture): each call records where its functions live (the call's `declared`),
so `replay run --code DIR` declares the op again from the trusted tree, in a process that never
saw the program; untrusted, it is refused (exit 2); a verify mismatch's tree whose function is
fixed passes against the reference (exit 0)."""
from __future__ import annotations

import functools
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from click.testing import CliRunner

import replay
from replay.cli import main
from replay.code import KernelCode
from replay.engine import declared
from replay.engine.session import CannotMake, ReplayOptions, op_for
from replay.registry import import_path
from replay.snapshot import CallRecord, Snapshot
from replay.verify import Mismatch

WRONG = '''import torch


def doubled_reference(x):
    return x.double().mul(2).float()


def doubled(x):
    """Wrong where an element passes 50: it comes out NaN."""
    out = x * 2
    {mask}
    return out
'''


LAZY = '''import os

looked_up = []


def __getattr__(name):  # a lazy loader: a path walked through getattr would run it
    looked_up.append(name)
    raise AttributeError(name)
'''


def write_library(root: Path, fixed: bool) -> Path:
    (root / "rowlib").mkdir(parents=True)
    (root / "rowlib" / "__init__.py").write_text("")
    (root / "rowlib" / "lazy.py").write_text(LAZY)
    (root / "rowlib" / "ops.py").write_text(WRONG.format(mask="pass" if fixed else 'out[x > 50] = float("nan")'))
    return root


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """rowlib imported from a tree of its own (no `import replay` in it), and forgotten after."""
    monkeypatch.syspath_prepend(str(write_library(tmp_path / "tree", fixed=False)))
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True)
    import rowlib.ops
    yield rowlib.ops
    for name in [m for m in sys.modules if m == "rowlib" or m.startswith("rowlib.")]:
        del sys.modules[name]


def replay_run(snapshot: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`replay run` in a process of its own: no op of the program declared there."""
    return subprocess.run([sys.executable, "-m", "replay", "run", str(snapshot), *options],
                          capture_output=True, text=True, cwd=snapshot.parent, timeout=300)


def mismatches(library: object, reference: Callable[..., Any], **options: Any) -> list[Mismatch]:
    """The library's `doubled` verified in the test (not in its module) on every call: one right
    call, then one with an element of 60 (wrong)."""
    found: list[Mismatch] = []
    verified = replay.verify(reference=reference, sample=1.0, outliers=False, on_mismatch=found.append,
                             **options)(library.doubled)  # type: ignore[attr-defined]
    try:
        verified(torch.ones(4, 8))
        x = torch.ones(4, 8)
        x[2, 5] = 60.0
        verified(x)
        assert replay.verify.drain() == 0
    finally:
        replay.verify.stop("doubled")
    return found


def test_a_function_verified_outside_its_module_replays_from_the_trusted_tree(
        library: object, tmp_path: Path) -> None:
    found = mismatches(library, library.doubled_reference, rtol=1e-6)  # type: ignore[attr-defined]
    assert len(found) == 1 and found[0].call == 1
    line = found[0].line()
    assert "in 1/32 elements (first at [2, 5]: nan vs 120.0;" in line, line
    assert found[0].snapshot is not None, found[0].unwritten
    declared = Snapshot(found[0].snapshot).load(0).declared
    assert declared == {"variants": {"default": "rowlib.ops:doubled", "reference": "rowlib.ops:doubled_reference"},
                        "state": [], "mutates": [], "outputs": [], "metric": None,
                        "tolerance": {"rtol": 1e-6, "atol": 0.0}}

    untrusted = replay_run(found[0].snapshot)
    assert untrusted.returncode == 2 and "--code" in untrusted.stderr, untrusted.stderr
    wrong = replay_run(found[0].snapshot, "--code", str(tmp_path / "tree"))
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "first at [2, 5]: nan vs 120.0" in " ".join(wrong.stdout.split()), wrong.stdout
    # the recorded output is the wrong one: a tree fixed since answers to the reference, as a bisect's probes do
    fixed = replay_run(found[0].snapshot, "--code", str(write_library(tmp_path / "fixed", fixed=True)),
                       "--oracle", "reference")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_a_reference_that_cannot_be_imported_records_nothing_to_declare_from(library: object) -> None:
    found = mismatches(library, lambda x: x.double().mul(2).float())
    assert len(found) == 1 and found[0].snapshot is not None
    assert Snapshot(found[0].snapshot).load(0).declared is None


@pytest.mark.parametrize("path", ["rowlib.ops:torch.exp", "rowlib.ops:doubled.__call__", "rowlib.ops:absent",
                                  "rowlib.lazy:os.system", "rowlib.lazy:missing.name"])
def test_a_recorded_path_names_only_a_function_defined_in_its_trusted_module(
        library: object, tmp_path: Path, path: str) -> None:
    """A snapshot naming `module:qualname` reaches no further than the functions that module
    defines: not what it imported, nor an attribute of one, and never through a lazy loader."""
    record = CallRecord(index=0, op="doubled_elsewhere", variant="default", provider="rowlib.ops", args=[],
                        tensors={}, declared={"variants": {"default": path, "reference": "rowlib.ops:doubled_reference"}})
    with pytest.raises(declared.NotInCode, match="is in this code"):
        declared.declare_again(KernelCode(tmp_path / "tree"), record, "snap: call 0")
    assert sys.modules["rowlib.lazy"].looked_up == [] if "rowlib.lazy" in sys.modules else True


def test_only_a_plain_function_of_a_module_has_an_import_path(library: object) -> None:
    module = library  # rowlib.ops
    assert import_path(module.doubled) == "rowlib.ops:doubled"  # type: ignore[attr-defined]
    assert import_path(functools.partial(module.doubled)) is None  # type: ignore[attr-defined]
    assert import_path(torch.nn.Linear(2, 2)) is None  # a callable object
    assert import_path(torch.nn.Linear(2, 2).forward) is None  # a method bound to an object
    assert import_path(torch.exp) is None  # a builtin


def test_a_namesake_declared_by_another_module_is_not_the_calls_op(library: object, tmp_path: Path) -> None:
    """A call whose op was declared where it was decorated is made only by that op: one of the
    same name from another module is no stand-in for it."""
    replay.op("doubled_namesake")  # declared by this test module
    record = CallRecord(index=0, op="doubled_namesake", variant="default", provider="rowlib.ops", args=[],
                        tensors={}, declared={"variants": {"default": "rowlib.ops:doubled"}})
    with pytest.raises(CannotMake, match="declared here by 'test_verify_declared'"):
        op_for(KernelCode(tmp_path / "tree"), record, types.SimpleNamespace(path="snap"), ReplayOptions())


def test_a_mismatch_says_why_an_output_cannot_be_compared_and_how_many_elements_differ() -> None:
    incomparable = Mismatch("op", "batched", 3, "out", [], 0.0, None, mismatches=36, numel=36,
                            problem="shape (6, 6) vs (6, 5)")
    assert "differs from the reference (shape (6, 6) vs (6, 5)); no snapshot" in incomparable.line()
    by_metric = Mismatch("op", "batched", 3, "out", [], 0.01, None, numel=32, metric="nmse 0.002 (bound 1e-06)")
    assert "from the reference (nmse 0.002 (bound 1e-06); max error 0.01)" in by_metric.line()


def test_a_library_function_captured_in_the_program_replays_from_the_trusted_tree(
        library: object, tmp_path: Path) -> None:
    """replay.capture applied in the program (not in the library's module) to a plain function:
    its recording replays from the trusted tree, passes there, and an edited tree is named."""
    captured = replay.capture("doubled_captured", variant="batched")(library.doubled)  # type: ignore[attr-defined]
    snapshot = tmp_path / "recorded"
    with replay.recording(snapshot):
        captured(torch.ones(4, 8))
        captured(torch.full((4, 8), 60.0))
    header = Snapshot(snapshot).load(1)
    assert header.declared is not None and header.declared["variants"] == {"batched": "rowlib.ops:doubled"}
    same = replay_run(snapshot, "--code", str(tmp_path / "tree"))
    assert same.returncode == 0, same.stdout + same.stderr
    edited = replay_run(snapshot, "--code", str(write_library(tmp_path / "fixed", fixed=True)))
    assert edited.returncode == 1 and "call 1" in edited.stdout, edited.stdout + edited.stderr


def test_a_function_captured_in_its_own_module_records_no_declaration() -> None:
    """Its module declares the op when a replay imports it: nothing more goes into each call."""
    @replay.capture("declared_here_doubled")
    def doubled_here(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert replay.registry.get_op("declared_here_doubled").declared is None


def test_an_op_of_the_recording_script_is_named_as_such_not_as_an_untrusted_module(tmp_path: Path) -> None:
    """`__main__` at replay is replay's own: trusting it could never make the call, so the answer
    says where the op must live instead (untestable, exit 125, as a script's Triton kernel is)."""
    def tripled(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    tripled.__module__ = "__main__"  # as a function of `python prog.py` is
    captured = replay.capture("declared_in_script_tripled")(tripled)
    with replay.recording(tmp_path / "s"):
        captured(torch.ones(3))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "s"), "--code", str(tmp_path)])
    assert result.exit_code == 125, result.output
    assert "defined in the recorded program's own script, which replay does not run" in " ".join(result.output.split())
