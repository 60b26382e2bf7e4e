"""The parity checks and the kv_scatter contract catch the planted bugs, naming op, rows and element."""
from __future__ import annotations

import re

import pytest
import torch

import kernel_cases
from kernels import bugs, parity
from kernels.model import record_prefill
from replay.registry import get_op
from replay.snapshot import Snapshot


def test_q6k_wrong_scale_index_is_caught_with_op_rows_and_element(dev):
    args = kernel_cases.make("q6k_gemv", 3, torch.float32, dev)
    assert parity.row_parity("q6k_gemv", args).ok  # the same check passes without the bug
    with bugs.planting("q6k_scale_index"):
        report = parity.row_parity("q6k_gemv", args)
    assert not report.ok
    assert report.message.startswith("op 'q6k_gemv': batched differs from single row by row: out at rows [0, 1, 2] of 3")
    assert re.search(r"first at out\[0, \d+\]: batched=\S+ single=\S+", report.message)
    # against the reference, batched is the one that is wrong
    with bugs.planting("q6k_scale_index"):
        assert parity.reference_violations("q6k_gemv", args, "batched")
        assert parity.reference_violations("q6k_gemv", kernel_cases.make("q6k_gemv", 1, torch.float32, dev),
                                           "single") == []


def test_stale_position_buf_in_batched_kv_scatter_is_caught(dev):
    # a fresh prefill: kv_cache_lengths 0, positions 0..3 given, position_buf still all zeros
    args = kernel_cases.make("kv_scatter", 4, torch.float32, dev, cached=0)
    assert parity.row_parity("kv_scatter", args).ok
    with bugs.planting("kv_scatter_stale_position_buf"):
        report = parity.row_parity("kv_scatter", args)
    assert not report.ok
    assert report.message.startswith("op 'kv_scatter': batched differs from single row by row: "
                                     "tag positions at rows [1, 2, 3] of 4; first at positions[1]: batched=0 single=1")
    assert "k_cache; first at k_cache[" in report.message


def test_kv_scatter_contract_reads_the_stale_position_buf_as_such(dev):
    op = get_op("kv_scatter")
    args = kernel_cases.make("kv_scatter", 4, torch.float32, dev, cached=0)
    with bugs.planting("kv_scatter_stale_position_buf"):
        run = parity.run_variant(op, "batched", parity.clone_args(args))
    (violation,) = [v for c in op.contracts for v in c.check(args, run.outputs)]
    assert violation == "K/V rows found written at positions [0] but kv_cache_lengths before (0) + arange(4) expects [0, 1, 2, 3]"


def test_recorded_prefill_with_the_bug_scatters_every_token_to_position_0(tmp_path, dev):
    with bugs.planting("kv_scatter_stale_position_buf"):
        path = record_prefill(tmp_path / "snap", prompt_len=3, device=dev)
    snap = Snapshot(path)
    scatters = [call for call in snap if call.op == "kv_scatter"]
    assert len(scatters) == 2  # one per layer
    for call in scatters:
        assert call.variant == "batched"
        assert call.role("tag")["positions"].tolist() == [0, 0, 0]
        assert call.role("state")["position_buf"][:3].tolist() == [0, 0, 0]
        assert [launch["path"] for launch in call.launch] == ["indirect"]


def test_unknown_planted_bug_is_refused():
    with pytest.raises(KeyError, match="no planted bug named 'nope'"):
        with bugs.planting("nope"):
            pass
