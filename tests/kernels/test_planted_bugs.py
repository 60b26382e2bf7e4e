"""The replay engine's checks and the kv_scatter contract catch the planted bugs, naming op, rows and element."""
from __future__ import annotations

import re

import pytest
import torch

import kernel_cases
from replay_kernels import bugs
from replay_kernels.model import record_prefill
from replay.snapshot import Snapshot


def test_q6k_wrong_scale_index_is_caught_with_op_rows_and_element(dev):
    args = kernel_cases.make("q6k_gemv", 3, torch.float32, dev)
    clean = kernel_cases.check("q6k_gemv", args, dev)
    assert clean.passed, kernel_cases.explain(clean)  # the same checks pass without the bug
    with bugs.planting("q6k_scale_index"):
        report = kernel_cases.check("q6k_gemv", args, dev)
    assert not report.passed
    top = report.failures[0]
    assert (top.kind, top.variant, top.against, top.name, top.bad_rows) == ("single-vs-batched", "batched", "single",
                                                                        "out", [0, 1, 2])
    assert re.match(r"op 'q6k_gemv': batched vs single: 'out' differs in \d+/120 elements; rows 0-2 of 3 wrong; "
                    r"first at \[0, \d+\]: \S+ vs \S+", kernel_cases.explain(report))
    # against the reference, batched is the one that is wrong
    assert {c.variant: c.passed for c in kernel_cases.against(report, "reference")} == {"batched": False,
                                                                                      "single": True}


def test_stale_position_buf_in_batched_kv_scatter_is_caught(dev):
    # a fresh prefill: kv_cache_lengths 0, positions 0..3 given, position_buf still all zeros
    args = kernel_cases.make("kv_scatter", 4, torch.float32, dev, cached=0)
    clean = kernel_cases.check("kv_scatter", args, dev)
    assert clean.passed, kernel_cases.explain(clean)
    with bugs.planting("kv_scatter_stale_position_buf"):
        report = kernel_cases.check("kv_scatter", args, dev)
    assert not report.passed
    assert kernel_cases.explain(report).startswith("op 'kv_scatter': ")
    by_single = {c.name: c.describe() for c in kernel_cases.against(report, "single") if not c.passed}
    assert by_single["positions"] == ("batched vs single: 'positions' differs in 3/4 elements; rows 1-3 of 4 wrong; "
                                      "first at [1]: 0 vs 1")
    assert re.match(r"batched vs single: 'k_cache' differs in \d+/\d+ elements; first at \[", by_single["k_cache"])
    first_tag = report.first_tag()
    assert (first_tag.variant, first_tag.name, first_tag.bad_rows) == ("batched", "positions", [1, 2, 3])


def test_kv_scatter_contract_reads_the_stale_position_buf_as_such(dev):
    args = kernel_cases.make("kv_scatter", 4, torch.float32, dev, cached=0)
    with bugs.planting("kv_scatter_stale_position_buf"):
        report = kernel_cases.check("kv_scatter", args, dev, "batched")
    (violation,) = kernel_cases.contract_violations(report, "batched")
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
