"""The kv_scatter contract: positions follow kv_cache_lengths, lengths advance by seq_len_buf."""
from __future__ import annotations

import pytest
import torch

import kernel_cases
from kernels import parity
from replay.registry import get_op

OP = get_op("kv_scatter")


def _violations(args, variant="batched"):
    run = parity.run_variant(OP, variant, parity.clone_args(args))
    return [v for contract in OP.contracts for v in contract.check(args, run.outputs)]


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("indirect", [False, True], ids=["direct", "indirect"])
def test_correct_calls_keep_the_contract(paged, indirect, dev):
    args = kernel_cases.make("kv_scatter", 3, torch.float16, dev, paged=paged, indirect=indirect)
    assert _violations(args) == []
    assert _violations(kernel_cases.make("kv_scatter", 1, torch.float16, dev, paged=paged, indirect=indirect),
                       "single") == []


def test_decode_step_with_a_stale_position_buf_is_named(dev):
    # a graph decode step whose host forgot to refill position_buf: it still says 4, cache holds 5
    args = kernel_cases.make("kv_scatter", 1, torch.float32, dev, indirect=True)
    args["position_buf"][0] = 4
    assert _violations(args, "single") == [
        "stale position_buf: it holds positions [4] but kv_cache_lengths before (5) + arange(1) expects [5]",
        "K/V rows found written at positions [4] but kv_cache_lengths before (5) + arange(1) expects [5]",
    ]


def test_stale_seq_len_buf_is_named(dev):
    args = kernel_cases.make("kv_scatter", 1, torch.float32, dev)
    args["seq_len_buf"][0] = 6  # left over from a 6-token prefill
    assert _violations(args, "single") == ["seq_len_buf holds 6 but the call writes 1 row(s)"]


def test_rows_swapped_between_their_positions_are_named(dev):
    args = kernel_cases.make("kv_scatter", 2, torch.float32, dev)
    args["positions"] = args["positions"].flip(0)
    assert _violations(args) == [
        "positions [6, 5] given, but kv_cache_lengths before (5) + arange(2) expects [5, 6]",
        "K/V rows found written at positions [5, 6] but kv_cache_lengths before (5) + arange(2) expects [5, 6] "
        "(rows [0, 1] are not the rows given for them)",
    ]
