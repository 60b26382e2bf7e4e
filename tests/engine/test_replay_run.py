"""`replay run` on toy ops: passes clean, and names call, variant, rows and tag of planted bugs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import toy_ops
import replay
from replay import registry
from replay.cli import main


def run_cli(*args: str) -> tuple[int, dict | str, str]:
    """`replay ARGS` in process; `run` trusts the toy provider, as a user would with --provider."""
    if args[:1] == ("run",):
        args = ("run", "--provider", "toy_ops", *args[1:])
    result = CliRunner().invoke(main, list(args))
    stdout = result.stdout
    try:
        return result.exit_code, json.loads(stdout), result.stderr
    except ValueError:
        return result.exit_code, stdout, result.stderr


@pytest.fixture
def rowscale_snapshot(tmp_path: Path) -> Path:
    toy_ops.record_rowscale(tmp_path / "rows")
    return tmp_path / "rows"


@pytest.fixture
def scatter_snapshot(tmp_path: Path) -> Path:
    toy_ops.record_scatter(tmp_path / "scatter")
    return tmp_path / "scatter"


def test_clean_snapshot_passes(rowscale_snapshot: Path) -> None:
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--json", "-")
    assert code == 0
    assert report["passed"] and report["calls_checked"] == 3
    kinds = {c["kind"] for call in report["calls"] for c in call["checks"]}
    assert {"single-vs-batched", "vs-reference", "vs-recorded", "tag"} <= kinds


def test_wrong_batched_rows_named(rowscale_snapshot: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_BUG", "rows")
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--json", "-")
    assert code == 1
    first = report["first_divergence"]
    assert (first["call"], first["op"], first["variant"]) == (0, "toy_rowscale", "batched")
    assert first["rows"] == list(range(1, 8)) and first["rows_total"] == 8
    assert first["tag"] == "scaled" and first["tag_rows"] == list(range(1, 8))


def test_stale_position_buf_named(scatter_snapshot: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_BUG", "stale")
    code, report, _ = run_cli("run", str(scatter_snapshot), "--json", "-")
    assert code == 1
    call = report["calls"][0]
    contract = [c for c in call["checks"] if c["kind"] == "contract" and not c["passed"]]
    assert [c["variant"] for c in contract] == ["batched"]
    assert "positions written [0, 0, 0, 0, 0, 0] but kv_cache_lengths implies [0, 1, 2, 3, 4, 5]" \
        in contract[0]["description"]
    assert report["first_divergence"]["tag"] == "positions"
    assert report["first_divergence"]["tag_rows"] == [1, 2, 3, 4, 5]


def test_serial_single_matches_batched_when_correct(scatter_snapshot: Path) -> None:
    code, report, _ = run_cli("run", str(scatter_snapshot), "--json", "-")
    assert code == 0, report["first_divergence"]
    names = {c["name"] for c in report["calls"][0]["checks"] if c["kind"] == "single-vs-batched"}
    assert names == {"cache", "kv_cache_lengths"}


def test_repeat_reports_nondeterminism(rowscale_snapshot: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_BUG", "race")
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--repeat", "3", "--variant", "batched",
                              "--json", "-")
    assert code == 1
    kinds = [c["kind"] for c in report["calls"][0]["checks"] if not c["passed"]]
    assert "repeat" in kinds


def test_repeat_is_quiet_for_deterministic_code(rowscale_snapshot: Path) -> None:
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--repeat", "3", "--json", "-")
    assert code == 0
    assert not [c for call in report["calls"] for c in call["checks"] if c["kind"] == "repeat"]


def test_golden_data_catches_edit_after_recording(rowscale_snapshot: Path, tmp_path: Path) -> None:
    edited = tmp_path / "edited"
    edited.mkdir()
    source = Path(toy_ops.__file__).read_text()
    (edited / "toy_ops.py").write_text(source.replace("scaled = x * 2\n", "scaled = x * 2.0001\n"))
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--golden-data", "--code", str(edited),
                              "--json", "-")
    assert code == 1
    first = report["first_divergence"]
    assert first["kind"] == "vs-golden" and first["variant"] == "batched"
    assert first["tag"] == "scaled"
    # Within a loose tolerance the same edit passes.
    code, _, _ = run_cli("run", str(rowscale_snapshot), "--golden-data", "--code", str(edited),
                         "--rtol", "1e-3", "--json", "-")
    assert code == 0


def test_golden_against_another_snapshot(rowscale_snapshot: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_BUG", "rows")
    toy_ops.record_rowscale(tmp_path / "buggy")
    monkeypatch.delenv("TOY_BUG")
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--golden-data", str(tmp_path / "buggy"),
                              "--json", "-")
    assert code == 1
    assert report["first_divergence"]["rows"] == list(range(1, 8))


def test_diff_names_first_divergence(rowscale_snapshot: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, _ = run_cli("diff", str(rowscale_snapshot), str(rowscale_snapshot), "--json", "-")
    assert code == 0 and report["identical"]
    monkeypatch.setenv("TOY_BUG", "rows")
    toy_ops.record_rowscale(tmp_path / "buggy")
    code, report, _ = run_cli("diff", str(rowscale_snapshot), str(tmp_path / "buggy"), "--json", "-")
    assert code == 1
    first = report["first_divergence"]
    assert first["position"] == 0 and first["tensor"] == "tag/scaled"
    assert first["comparison"]["bad_rows"] == list(range(1, 8))


@pytest.mark.parametrize("make_bad, needle, exit_code", [
    (lambda p: shutil.rmtree(p), "no such snapshot directory", 2),
    (lambda p: (shutil.rmtree(p), p.write_text("{}")), "a file, not a snapshot directory", 2),
    (lambda p: (p / "calls.jsonl").unlink(), ": no calls recorded", 2),  # killed before its first call
    (lambda p: next((p / "segments").iterdir()).write_bytes(b"garbage"), "segments/00000000.safetensors", 2),
    (lambda p: (p / "calls.jsonl").write_text("{not json\n"), "calls.jsonl:1: malformed index line", 2),
])
def test_bad_input_one_line(rowscale_snapshot: Path, make_bad, needle: str, exit_code: int) -> None:
    make_bad(rowscale_snapshot)
    code, _, stderr = run_cli("run", str(rowscale_snapshot))
    assert code == exit_code
    assert needle in stderr and stderr.count("\n") == 1


def test_op_gone_from_provider_is_untestable(rowscale_snapshot: Path) -> None:
    del registry._OPS["toy_rowscale"]  # as if the provider renamed the op since recording
    code, report, _ = run_cli("run", str(rowscale_snapshot), "--json", "-")
    assert code == 125  # this code cannot make the recorded call: a bisect skips the commit
    assert "op 'toy_rowscale' is not declared by provider 'toy_ops'" in report["untestable"]


def test_unknown_variant_is_bad_input(rowscale_snapshot: Path) -> None:
    code, _, stderr = run_cli("run", str(rowscale_snapshot), "--variant", "warp_specialised")
    assert code == 2
    assert "has no variant 'warp_specialised' (it has: reference, single, batched)" in stderr


def test_provider_import_failure_is_untestable(rowscale_snapshot: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "toy_ops.py").write_text("raise ImportError('kernel build exploded')\n")
    code, _, stderr = run_cli("run", str(rowscale_snapshot), "--code", str(broken))
    assert code == 125
    assert "kernel build exploded" in stderr and stderr.count("\n") == 1


def test_golden_data_from_another_environment_warns_once(rowscale_snapshot: Path) -> None:
    manifest_path = rowscale_snapshot / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["environment"]["triton"] = "0.0-elsewhere"
    manifest_path.write_text(json.dumps(manifest))
    code, report, stderr = run_cli("run", str(rowscale_snapshot), "--golden-data", "--json", "-")
    assert code == 0  # a warning, not a verdict
    warnings = [line for line in stderr.splitlines() if line.startswith("replay: warning:")]
    assert len(warnings) == 1 and "triton 0.0-elsewhere then" in warnings[0]
    assert report["warnings"] == [warnings[0].removeprefix("replay: warning: ")]


def test_a_cut_index_line_is_said_and_the_whole_lines_replayed(rowscale_snapshot: Path) -> None:
    with open(rowscale_snapshot / "calls.jsonl", "a") as index:
        index.write('{"index": 3, "op": "toy_rows')  # a write cut short
    code, report, stderr = run_cli("run", str(rowscale_snapshot), "--json", "-")
    assert code == 2 and report["calls_checked"] == 3 and all(call["passed"] for call in report["calls"])
    assert stderr.splitlines() == [f"replay: error: {rowscale_snapshot / 'calls.jsonl'}:4: the last line is cut short "
                                   "(28 bytes, no newline): its call is not indexed"]


def test_a_corrupt_segment_is_named_and_the_other_calls_replayed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rowscale_snapshot = tmp_path / "rows"
    toy_ops.record_rowscale(rowscale_snapshot, asynchronous=False)  # a segment a call
    damaged = sorted((rowscale_snapshot / "segments").iterdir())[1]
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)
    monkeypatch.setenv("TOY_BUG", "rows")
    code, report, stderr = run_cli("run", str(rowscale_snapshot), "--json", "-")
    assert code == 2  # bad input outranks the divergence: the snapshot must be mended first
    assert [call["index"] for call in report["calls"]] == [0, 2] and not report["passed"]
    assert report["problems"] == [f"{damaged}: sha256 mismatch (corrupt or truncated file)"]
    assert stderr.splitlines() == [f"replay: error: {damaged}: sha256 mismatch (corrupt or truncated file)"]


def record_chain(path: Path, length: int = 3) -> None:
    """Calls feeding each other (each takes the last one's output), then one on fresh inputs."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, generator=gen)
    with replay.recording(path):
        h = torch.randn(8, 16, generator=gen)
        for _ in range(length):
            h = toy_ops.rowscale_batched(h, w)
        toy_ops.rowscale_batched(torch.randn(8, 16, generator=gen), w)


def test_diff_lists_where_differences_start_and_counts_what_they_carry(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    record_chain(tmp_path / "clean")
    monkeypatch.setenv("TOY_BUG", "rows")
    record_chain(tmp_path / "buggy")
    code, report, _ = run_cli("diff", str(tmp_path / "clean"), str(tmp_path / "buggy"), "--json", "-")
    assert code == 1
    assert [(call["position"], call["knock_on"]) for call in report["calls"]] == [(0, False), (1, True), (2, True),
                                                                                 (3, False)]
    code, shown, _ = run_cli("diff", str(tmp_path / "clean"), str(tmp_path / "buggy"))
    rows = [line for line in shown.splitlines() if "tag/scaled" in line and line.startswith("│")]
    assert [line.split()[1] for line in rows] == ["0", "3"]  # the fresh call diverges on its own: listed
    assert "2 more calls differ only after their inputs did" in shown and "--all lists them" in shown
    code, everything, _ = run_cli("diff", str(tmp_path / "clean"), str(tmp_path / "buggy"), "--all")
    assert "more calls differ" not in everything and "in/x" in everything


def test_golden_data_from_other_inputs_is_said(rowscale_snapshot: Path, tmp_path: Path) -> None:
    record_chain(tmp_path / "other")  # the same op; after the first call, other inputs
    code, report, stderr = run_cli("run", str(rowscale_snapshot), "--golden-data", str(tmp_path / "other"),
                                   "--json", "-")
    assert code == 1
    warning = f"replay: warning: {tmp_path / 'other'}: the inputs of call(s) 1, 2 differ from {rowscale_snapshot}'s"
    assert any(line.startswith(warning) for line in stderr.splitlines()), stderr


def test_the_reference_oracle_holds_no_contract_against_outputs_recorded_on_other_code(
        scatter_snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_BUG", "stale")
    toy_ops.record_scatter(tmp_path / "at-the-bad-end")  # its recorded positions break the contract
    monkeypatch.delenv("TOY_BUG")
    code, report, _ = run_cli("run", str(tmp_path / "at-the-bad-end"), "--json", "-")
    assert code == 1 and report["first_divergence"]["variant"] == "batched (recorded)"
    code, report, _ = run_cli("run", str(tmp_path / "at-the-bad-end"), "--oracle", "reference", "--json", "-")
    assert code == 0, report["first_divergence"]  # the code replaying it is right: so says the reference


def test_saved_outputs_store_a_cache_as_the_recording_did(tmp_path: Path) -> None:
    cache = torch.zeros(64, 4096)  # 1 MiB: state stored in chunks
    with replay.recording(tmp_path / "snap", chunk_threshold=1):
        for step in range(6):
            toy_ops.rowscale_batched(torch.randn(8, 16), torch.ones(16))
            cache[step].fill_(step)
            toy_ops.scatter_batched(torch.randn(1, 4096), cache, torch.tensor([step], dtype=torch.int32),
                                    torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                                    torch.tensor([step], dtype=torch.int32))
    code, _, _ = run_cli("run", str(tmp_path / "snap"), "--save-outputs", str(tmp_path / "outputs"), "--json", "-")
    assert code == 0
    segments = sum(p.stat().st_size for p in (tmp_path / "outputs" / "segments").iterdir())
    assert segments < (1 << 20)  # no cache inline: twelve calls' segments hold less than one cache
    code, _, _ = run_cli("run", str(tmp_path / "snap"), "--golden-data", str(tmp_path / "outputs"), "--json", "-")
    assert code == 0


def test_outputs_that_cannot_be_written_are_bad_input(rowscale_snapshot: Path, tmp_path: Path) -> None:
    replay_bin = Path(sys.executable).with_name("replay")
    done = subprocess.run(f"ulimit -f 1; '{replay_bin}' run '{rowscale_snapshot}' --provider toy_ops "
                          f"--save-outputs '{tmp_path / 'outputs'}'", shell=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(toy_ops.__file__).parent)})
    assert done.returncode == 2, done.stderr  # a file size limit of 1 KiB: the outputs do not fit
    assert done.stderr.strip().startswith(f"replay: error: {tmp_path / 'outputs'}: cannot write the outputs: ")
