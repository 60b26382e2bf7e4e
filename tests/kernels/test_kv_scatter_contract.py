"""The kv_scatter contract: positions follow kv_cache_lengths, lengths advance by seq_len_buf."""
from __future__ import annotations

import pytest
import torch

import kernel_cases


def violations(args, dev, variant="batched"):
    """What the kv_scatter contract finds in `variant` run on `args`, as the replay engine reports it."""
    return kernel_cases.contract_violations(kernel_cases.check("kv_scatter", args, dev, variant), variant)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("indirect", [False, True], ids=["direct", "indirect"])
def test_correct_calls_keep_the_contract(paged, indirect, dev):
    args = kernel_cases.make("kv_scatter", 3, torch.float16, dev, paged=paged, indirect=indirect)
    assert violations(args, dev) == []
    assert violations(kernel_cases.make("kv_scatter", 1, torch.float16, dev, paged=paged, indirect=indirect),
                      dev, "single") == []


def test_decode_step_with_a_stale_position_buf_is_named(dev):
    # a graph decode step whose host forgot to refill position_buf: it still says 4, cache holds 5
    args = kernel_cases.make("kv_scatter", 1, torch.float32, dev, indirect=True)
    args["position_buf"][0] = 4
    assert violations(args, dev, "single") == [
        "stale position_buf: it holds positions [4] but kv_cache_lengths before (5) + arange(1) expects [5]",
        "K/V rows found written at positions [4] but kv_cache_lengths before (5) + arange(1) expects [5]",
    ]


def test_stale_seq_len_buf_is_named(dev):
    args = kernel_cases.make("kv_scatter", 1, torch.float32, dev)
    args["seq_len_buf"][0] = 6  # left over from a 6-token prefill
    # batched runs the call as given; the engine's single replays it through split_row, which sets
    # seq_len_buf to 1, so there the contract would also see kv_cache_lengths advance by 1, not 6
    assert violations(args, dev) == ["seq_len_buf holds 6 but the call writes 1 row(s)"]


def test_rows_swapped_between_their_positions_are_named(dev):
    args = kernel_cases.make("kv_scatter", 2, torch.float32, dev)
    args["positions"] = args["positions"].flip(0)
    assert violations(args, dev) == [
        "positions [6, 5] given, but kv_cache_lengths before (5) + arange(2) expects [5, 6]",
        "K/V rows found written at positions [5, 6] but kv_cache_lengths before (5) + arange(2) expects [5, 6] "
        "(rows [0, 1] are not the rows given for them)",
    ]
