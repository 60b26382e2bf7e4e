"""Every op: batched with M=1 == single bitwise, every batched row == single on that row
bitwise, and both within the op's per-dtype tolerance of the reference, as the replay engine
checks them (outputs and tags)."""
from __future__ import annotations

import pytest
import torch

import kernel_cases
from replay_kernels.ggml_quant import Q4_K, Q6_K
from replay_kernels.kquant.matmul import BATCHED_BLOCK_M, TILE_CANDIDATES, kquant_matmul

# (op, case options): every op, plus the other layouts and paths each one has
CASES = [
    ("rmsnorm", {}), ("residual_add", {}), ("swiglu", {}),
    ("rope", {"layout": "neox"}), ("rope", {"layout": "interleaved"}),
    ("q4k_gemv", {}), ("q6k_gemv", {}),
    ("kv_scatter", {"paged": True}), ("kv_scatter", {"paged": False}),
    ("kv_scatter", {"paged": True, "indirect": True}),
    ("attention", {"paged": True}), ("attention", {"paged": False}),
]

# larger shapes on the GPU: several warps a row, K walks of many steps with a masked tail
GPU_SIZES = {"rmsnorm": {"hidden": 5000}, "residual_add": {"hidden": 9000}, "swiglu": {"width": 7000},
             "rope": {"heads": 32, "head_dim": 128}, "q4k_gemv": {"n": 300, "k": 4864},
             "q6k_gemv": {"n": 300, "k": 4864}}

ROWS = {"cpu": 5, "cuda": 11}  # both cross the batched GEMV's 4-row programs


def _id(case):
    op, options = case
    return "-".join([op, *(f"{k}={v}" for k, v in options.items())])


def _args(op, options, rows, dtype, dev, seed=0):
    sizes = GPU_SIZES.get(op, {}) if dev == "cuda" else {}
    return kernel_cases.make(op, rows, dtype, dev, seed=seed, **options, **sizes)


def _row_parity(op, args, dev):
    """Batched on all rows against single row by row, bit for bit: the engine's checks of them."""
    report = kernel_cases.check(op, args, dev, "batched", "single")
    return report, kernel_cases.against(report, "single")


@pytest.mark.parametrize("dtype", kernel_cases.DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_batched_of_one_row_equals_single(case, dtype, dev):
    op, options = case
    report, checks = _row_parity(op, _args(op, options, 1, dtype, dev), dev)
    assert all(c.passed for c in checks), kernel_cases.explain(report, checks)


@pytest.mark.parametrize("dtype", kernel_cases.DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_every_batched_row_equals_single_on_that_row(case, dtype, dev):
    op, options = case
    report, checks = _row_parity(op, _args(op, options, ROWS[dev], dtype, dev, seed=1), dev)
    assert all(c.passed for c in checks), kernel_cases.explain(report, checks)
    assert {c.comparison.rows for c in checks if c.comparison and c.comparison.rows} == {ROWS[dev]}


@pytest.mark.parametrize("dtype", kernel_cases.DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_single_and_batched_match_the_reference(case, dtype, dev):
    op, options = case
    for variant, rows, seed in (("single", 1, 2), ("batched", ROWS[dev], 3)):
        report = kernel_cases.check(op, _args(op, options, rows, dtype, dev, seed=seed), dev, variant)
        checks = kernel_cases.against(report, "reference")
        assert all(c.passed for c in checks), kernel_cases.explain(report, checks)
        assert {c.variant for c in checks} == {variant}


@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
@pytest.mark.parametrize("config", TILE_CANDIDATES, ids=str)
def test_every_gemv_tile_candidate_keeps_rows_invariant(config, fmt, dev):
    # whichever candidate a sweep may promote, batched rows equal single calls bit for bit
    weight, x = _gemv_inputs(fmt, dev)
    batched = kquant_matmul(x, weight, fmt, block_m=BATCHED_BLOCK_M, config=config)
    _assert_each_row_equals_its_single_call(batched, x, weight, fmt, config)


@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
@pytest.mark.parametrize("single_rows", [1, 2])
def test_gemv_programs_of_fewer_rows_give_the_same_bits(single_rows, fmt, dev):
    # tile_config gives single calls fewer weight rows a program than batched ones on a GPU; the K walk
    # (32 lanes, one warp) is shared, so each output must come out the same
    weight, x = _gemv_inputs(fmt, dev)
    batched = kquant_matmul(x, weight, fmt, block_m=BATCHED_BLOCK_M, config=(4, 32, 1, 4))
    _assert_each_row_equals_its_single_call(batched, x, weight, fmt, (single_rows, 32, 1, single_rows))


def _assert_each_row_equals_its_single_call(batched, x, weight, fmt, single_config):
    for r in range(x.shape[0]):
        single = kquant_matmul(x[r:r + 1], weight, fmt, block_m=1, config=single_config)
        assert torch.equal(batched[r:r + 1], single), r


def _gemv_inputs(fmt, dev):
    # six super-blocks: one full step of four and a tail of two, so the K loop and the tail both run
    weight = kernel_cases.make(f"{fmt.name.lower().replace('_', '')}_gemv", 1, torch.float32, dev, n=16, k=1536)["weight"]
    return weight, torch.randn(2, 1536, generator=torch.Generator().manual_seed(0)).to(dev)
