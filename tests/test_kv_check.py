"""`replay kv-check`: the tiny model's serial, batched and chunked prefills leave the same KV cache,
and the stale-state bug class, planted three ways (kernels/bugs.py MODEL_BUGS), is caught with the
run, layer and positions named; `replay trace` shows the indirect path the stale prefill took."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay_kernels.bugs import MODEL_BUGS
from replay_kernels.kv_adapter import adapter_of
from replay.cli import main
from replay.kv.caches import check_snapshot, logits_findings
from replay.kv.runs import RunPlan, record_runs
from replay.snapshot import Snapshot

PROMPT = 4


def kv_check(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["kv-check", *args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def buggy_runs(bug: str, chunks: tuple[int, ...], decode_steps: int, where: Path):
    last = record_runs(adapter_of(MODEL_BUGS[bug]), "cuda" if _cuda() else "cpu",
                       RunPlan(PROMPT, chunks, decode_steps), where)
    report = check_snapshot(Snapshot(where))
    report.findings += logits_findings(last)
    return report


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_tiny_model_leaves_the_same_cache_however_it_prefills(tmp_path: Path) -> None:
    code, report = kv_check("--prompt-len", str(PROMPT), "--chunks", "3,N", "--decode-steps", "2",
                            "--keep", str(tmp_path / "runs"))
    assert code == 0, report["findings"]
    assert report["runs"] == ["serial", "chunks of 3", "batched"] and report["layers"] == 2
    assert report["positions"] == PROMPT + 2
    # the recording it kept is checked again as a snapshot, with no model at hand
    code, again = kv_check(str(tmp_path / "runs"))
    assert code == 0 and again["runs"] == report["runs"]


def test_a_prefill_reading_a_stale_position_buf_is_caught_and_traced(tmp_path: Path) -> None:
    report = buggy_runs("prefill_stale_position_buf", (0,), 0, tmp_path / "runs")
    assert not report.passed
    kv = [f for f in report.findings if f.kind == "kv" and f.run == "batched"]
    assert [(f.layer, f.details["tensor"]) for f in kv] == [(0, "K"), (0, "V"), (1, "K"), (1, "V")]
    assert kv[0].details["positions"] == list(range(PROMPT)) and kv[0].details["writer"]["paths"] == ["indirect"]
    state = [f.message for f in report.findings if f.kind == "state"]
    assert f"position_buf holds [0, 0, 0, 0] before call" in state[0] and "expects [0, 1, 2, 3]" in state[0]
    # the trace of the buggy run shows the prefill's scatters on the indirect path, the serial run's on it too
    result = CliRunner().invoke(main, ["trace", str(tmp_path / "runs"), "--op", "kv_scatter", "--json", "-"])
    prefill = [c for c in json.loads(result.stdout)["calls"] if c["variant"] == "batched"]
    assert prefill and all(c["launches"][0]["path"] == "indirect" for c in prefill)
    assert all(c["scope"]["run"] == "batched" for c in prefill)


def test_a_decode_step_that_forgets_seq_len_buf_is_caught(tmp_path: Path) -> None:
    report = buggy_runs("decode_stale_seq_len", (0,), 2, tmp_path / "runs")
    after_prefill = [f.message for f in report.findings if f.kind == "state" and f.run == "batched"]
    # the prefill left seq_len_buf at 4; the first decode step (step 1) reads it in both layers
    assert after_prefill[0].startswith(f"step 1, layer 0: seq_len_buf holds {PROMPT} before call")
    assert "the call writes 1 row(s)" in after_prefill[0]
    assert any(f.kind == "lengths" and f.run == "batched" for f in report.findings)


def test_a_chunked_prefill_at_the_wrong_offset_is_caught(tmp_path: Path) -> None:
    report = buggy_runs("chunk_offset", (1,), 0, tmp_path / "runs")
    kv = [f for f in report.findings if f.kind == "kv"]
    assert kv and all(f.run == "chunks of 1" for f in kv)
    assert kv[0].layer == 0 and kv[0].details["positions"][0] == 1
    state = [f.message for f in report.findings if f.kind == "state"]
    assert state[0].startswith("step 2, layer 0: positions holds [1] before call") and "expects [2]" in state[0]


@pytest.mark.parametrize("chunks", ["0", "x", ",", "-1"])
def test_bad_chunks_are_exit_2(chunks: str) -> None:
    result = CliRunner().invoke(main, ["kv-check", "--chunks", chunks])
    assert result.exit_code == 2 and "--chunks" in result.stderr


def test_a_recording_of_one_run_is_checked_for_state_only_and_one_without_cache_writes_is_bad_input(
        tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[1] / "snapshots" / "prefill_001"
    result = CliRunner().invoke(main, ["kv-check", str(shipped)])
    assert result.exit_code == 0 and "one run only" in result.stdout and "no run to compare against" in result.stdout
    import hostile

    other = hostile.record(tmp_path / "snap")
    result = CliRunner().invoke(main, ["kv-check", str(other)])
    assert result.exit_code == 2 and "no call writes a KV cache" in result.stderr


def test_a_model_that_cannot_be_loaded_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(main, ["kv-check", "--model", "no_such_module_here:factory"])
    assert result.exit_code == 2 and "--model 'no_such_module_here:factory'" in result.stderr
    result = CliRunner().invoke(main, ["kv-check", "--model", "nonsense"])
    assert result.exit_code == 2 and "not a declared model (tiny)" in result.stderr


def test_a_chunk_as_long_as_the_prompt_is_the_batched_run_once() -> None:
    assert RunPlan(8, (8, 0, 16, 4), 0).chunks == (0, 4)
    assert RunPlan(8, (8, 0, 16, 4), 0).names() == ["serial", "batched", "chunks of 4"]
