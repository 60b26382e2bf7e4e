"""det_gemm: each output row the same bits alone or in any batch (forward and dx), dweight unchanged
by zero padding, within a bf16 bound of the fp64 reference; unsupported input is a clear error; and
`replay invariance` catches a planted split-K variant. CPU: the interpreter; GPU: the kernel."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from kernels import bugs
from kernels.det_gemm import DetLinear, matmul
from replay.cli import main

BATCHES = (1, 2, 3, 16, 17)


def _inputs(dev: str, m: int, n: int = 40, k: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dev, torch.bfloat16)
    return x, (torch.randn(n, k, generator=gen) / 8).to(dev, torch.bfloat16)


def _grads(x: torch.Tensor, weight: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    DetLinear.apply(x, weight).backward(upstream)
    return x.grad, weight.grad


def test_rows_are_the_same_bits_in_every_batch_forward_and_backward(dev: str) -> None:
    x, weight = _inputs(dev, max(BATCHES))
    upstream = torch.randn(x.shape[0], weight.shape[0], generator=torch.Generator().manual_seed(1)).to(dev, x.dtype)
    alone = torch.cat([DetLinear.apply(x[r:r + 1], weight) for r in range(x.shape[0])])
    dx_alone = torch.cat([_grads(x[r:r + 1], weight, upstream[r:r + 1])[0] for r in range(x.shape[0])])
    for size in BATCHES:
        for start in (0, x.shape[0] - size):
            rows = slice(start, start + size)
            assert torch.equal(DetLinear.apply(x[rows], weight), alone[rows]), (size, start)
            assert torch.equal(_grads(x[rows], weight, upstream[rows])[0], dx_alone[rows]), (size, start)


def test_the_weight_gradient_ignores_zero_padding_of_the_batch(dev: str) -> None:
    x, weight = _inputs(dev, 17)
    upstream = torch.randn(17, weight.shape[0], generator=torch.Generator().manual_seed(2)).to(dev, x.dtype)
    _, dw = _grads(x, weight, upstream)
    for pad in (1, 15, 40):
        padded_x = torch.cat([x, torch.zeros(pad, x.shape[1], dtype=x.dtype, device=dev)])
        padded_up = torch.cat([upstream, torch.zeros(pad, upstream.shape[1], dtype=x.dtype, device=dev)])
        assert torch.equal(_grads(padded_x, weight, padded_up)[1], dw), pad


def test_within_a_bf16_bound_of_the_fp64_reference(dev: str) -> None:
    x, weight = _inputs(dev, 33, n=72, k=160)
    got, want = DetLinear.apply(x, weight).double(), x.double() @ weight.double().t()
    # fp32 accumulation of exact bf16 products (error at most K * 2^-24 of the sum of |products|), then one
    # conversion to bf16: half an ulp on a GPU (round to nearest), under one in the interpreter (it truncates)
    bound = want.abs() * 2.0 ** -7 + 2 * 160 * 2.0 ** -24 * (x.double().abs() @ weight.double().abs().t())
    assert bool(((got - want).abs() <= bound).all())


def test_unsupported_input_is_a_clear_error(dev: str) -> None:
    x, weight = _inputs(dev, 2)
    with pytest.raises(TypeError, match="supported: bfloat16 and float16"):
        matmul(x.float(), weight.t().float())
    with pytest.raises(ValueError, match="do not multiply"):
        matmul(x, weight)


def test_invariance_holds_for_det_gemm_and_catches_split_k() -> None:
    args = ["invariance", "det_gemm", "--batch-sizes", "1,3,8", "--chunks", "3", "--pad", "2", "--json", "-"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    with bugs.planting("det_gemm_split_k"):
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    verdict = {(r["property"], r["size"]): r["passed"] for r in json.loads(result.stdout)["ops"][0]["results"]}
    assert verdict[("batch", 1)] and verdict[("batch", 3)] and not verdict[("batch", 8)]
