"""A library's plain function decorated in the program, not in its own module (replay.verify with
a reference, replay.capture): each call records where its functions live (the call's `declared`),
so `replay run --code DIR` declares the op again from the trusted tree, in a process that never
saw the program; untrusted, it is refused (exit 2); a verify mismatch's tree whose function is
fixed passes against the reference (exit 0)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import replay
from replay.snapshot import Snapshot
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


def write_library(root: Path, fixed: bool) -> Path:
    (root / "rowlib").mkdir(parents=True)
    (root / "rowlib" / "__init__.py").write_text("")
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


@pytest.mark.parametrize("path", ["rowlib.ops:torch.exp", "rowlib.ops:doubled.__call__", "rowlib.ops:absent"])
def test_a_recorded_path_names_only_a_function_defined_in_its_trusted_module(
        library: object, tmp_path: Path, path: str) -> None:
    """A snapshot naming `module:qualname` reaches no further than the functions that module
    defines: not what it imported, nor an attribute of one."""
    from replay.code import KernelCode
    from replay.engine import declared
    from replay.snapshot import CallRecord
    record = CallRecord(index=0, op="doubled_elsewhere", variant="default", provider="rowlib.ops", args=[],
                        tensors={}, declared={"variants": {"default": path, "reference": "rowlib.ops:doubled_reference"}})
    with pytest.raises(declared.NotInCode, match="is in this code"):
        declared.declare_again(KernelCode(tmp_path / "tree"), record, "snap: call 0")


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
