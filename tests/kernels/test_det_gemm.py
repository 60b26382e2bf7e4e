"""det_gemm: each output row the same bits alone or in any batch (forward and dx), dweight unchanged
by zero padding, within a bf16 bound of the fp64 reference; unsupported input is a clear error; and
`replay invariance` catches a planted split-K variant. CPU: the interpreter; GPU: the kernel."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from replay_kernels import bugs
from replay_kernels.det_gemm import DetLinear, error_bound, matmul
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
    bound = error_bound(x, weight, ulps=1.0 if dev == "cpu" else 0.5)  # the interpreter truncates to bf16
    assert bool(((got - want).abs() <= bound).all())
    # the bound is tight enough to mean something: an error of one bf16 ulp on one element breaks it
    bumped = got.clone()
    bumped[3, 5] = want[3, 5] + 2 * bound[3, 5]
    assert not bool(((bumped - want).abs() <= bound).all())


@pytest.mark.gpu
@pytest.mark.parametrize("k, n", [(4096, 4096), (4096, 12288), (4096, 11008), (11008, 4096), (4096, 32000)])
def test_7b_projection_shapes_are_within_the_bound(k: int, n: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(k + n)
    weight = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    for m in (1, 16, 128, 2048):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        err = (DetLinear.apply(x, weight).double() - x.double() @ weight.double().t()).abs()
        assert bool((err <= error_bound(x, weight)).all()), (k, n, m)


def test_unsupported_input_is_a_clear_error(dev: str) -> None:
    x, weight = _inputs(dev, 2)
    with pytest.raises(TypeError, match="supported: bfloat16 and float16"):
        matmul(x.float(), weight.t().float())
    with pytest.raises(ValueError, match="do not multiply"):
        matmul(x, weight)
    with pytest.raises(ValueError, match="a's rows of 7 values are not a multiple of 16 bytes"):
        matmul(x[:, :7].contiguous(), weight[:, :7].t())


def test_either_layout_and_a_strided_view_give_the_same_bits(dev: str) -> None:
    x, weight = _inputs(dev, 8)
    want = matmul(x, weight.t())  # the weight read as [N, K], transposed in the kernel
    assert torch.equal(matmul(x, weight.t().contiguous()), want)  # read as [K, N]
    assert torch.equal(matmul(x.t().contiguous().t(), weight.t()), want)  # x read column-major: 8 rows, 16 bytes
    assert torch.equal(matmul(x[:5].t().contiguous().t(), weight.t()), want[:5])  # 5 rows: copied row-major
    wide = torch.cat([x, x], dim=1)
    assert torch.equal(matmul(wide[:, :x.shape[1]], weight.t()), want)  # a view whose rows do not touch


def _invariance(dev: str, *args: str) -> tuple[int, dict[tuple[str, int], dict]]:
    result = CliRunner().invoke(main, ["invariance", "det_gemm", "--batch-sizes", "1,3,8", "--chunks", "3", "--pad",
                                       "2,5", "--dtype", "bfloat16", "--device", dev, *args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, {(r["property"], r["size"]): r for r in json.loads(result.stdout)["ops"][0]["results"]}


def test_invariance_holds_for_det_gemm_and_catches_split_k(dev: str) -> None:
    code, results = _invariance(dev)
    assert code == 0 and all(r["passed"] for r in results.values()), results
    with bugs.planting("det_gemm_split_k"):
        code, results = _invariance(dev)
    assert code == 1
    assert results[("batch", 1)]["passed"] and results[("batch", 3)]["passed"] and not results[("batch", 8)]["passed"]


def test_backward_invariance_holds_and_catches_a_weight_gradient_split_over_the_batch(dev: str) -> None:
    code, results = _invariance(dev, "--backward")
    assert code == 0 and all(r["passed"] for r in results.values()), results
    with bugs.planting("det_gemm_split_m_backward"):
        code, results = _invariance(dev, "--backward")
    assert code == 1
    # rows (outputs and dx) stay put; only the weight gradient, reduced over a padded batch, moves
    assert all(r["passed"] for (prop, _), r in results.items() if prop != "padding")
    for pad in (2, 5):
        assert results[("padding", pad)]["whole_changed"] == ["grad weight"]
        assert results[("padding", pad)]["first"].startswith("grad weight (reduced over the rows)")


def test_backward_of_an_op_without_gradients_is_a_one_line_error() -> None:
    result = CliRunner().invoke(main, ["invariance", "rmsnorm", "--backward"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "replay: error: op 'rmsnorm' variant 'batched' is not differentiable: its " \
                                    "outputs carry no gradient (--backward)"
