"""Each kernel op has exactly its reference, single and batched variants; asking for anything
else is a clear error listing what exists, never a fallback to another op or variant."""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import replay_kernels
from replay_kernels import launch, rmsnorm
from replay_kernels.model import TinyLlama
from replay.errors import RegistryError
from replay.registry import get_op


@pytest.mark.parametrize("name", replay_kernels.OPS)
def test_every_op_has_its_three_variants_on_both_backends(name):
    op = get_op(name)
    assert op.provider.startswith("replay_kernels.") and importlib.import_module(op.provider)
    assert list(op.variants) == ["reference", "single", "batched"]
    for variant in op.variants.values():
        assert variant.backends == ("cpu", "cuda")
        assert variant.fn.__module__ == op.provider


def test_unknown_variant_lists_the_variants_that_exist():
    with pytest.raises(RegistryError, match=r"op 'q6k_gemv' has no variant 'deterministic' "
                                            r"\(it has: reference, single, batched\)"):
        get_op("q6k_gemv").get("deterministic", "cuda")


def test_unknown_backend_lists_the_backends_that_exist():
    with pytest.raises(RegistryError, match=r"op 'rmsnorm' variant 'batched' cannot run on backend 'rocm' "
                                            r"\(it runs on: cpu, cuda\)"):
        get_op("rmsnorm").get("batched", "rocm")


def test_unknown_op_lists_the_registered_ops():
    with pytest.raises(RegistryError, match=r"(?s)unknown op 'q5k_gemv' \(registered: .*q4k_gemv.*q6k_gemv"):
        get_op("q5k_gemv")


def test_model_asks_the_registry_for_its_backend(monkeypatch):
    monkeypatch.setattr(get_op("attention").get("single"), "backends", ("cuda",))
    with pytest.raises(RegistryError, match="op 'attention' variant 'single' cannot run on backend 'cpu'"):
        TinyLlama(device="cpu")


def test_triton_variant_on_cpu_without_the_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="rmsnorm: Triton kernels on CPU tensors need TRITON_INTERPRET=1"):
        launch.check_device("rmsnorm", torch.zeros(1))


def test_a_decorated_kernel_keeps_its_own_signature_and_docstring():
    kernel = rmsnorm.rmsnorm_rows
    original = kernel.variant.fn
    assert kernel is not original and kernel.__wrapped__ is original
    assert list(inspect.signature(kernel).parameters) == ["x", "weight", "eps"]
    assert inspect.signature(kernel) == inspect.signature(original)
    assert kernel.__doc__ == original.__doc__ and kernel.__doc__.startswith("x [M, H] normalised row by row")
    assert kernel.__name__ == "rmsnorm_rows"


def test_the_single_variant_of_a_kernel_refuses_a_batch():
    with pytest.raises(ValueError, match="rmsnorm single: takes one row, got 2; use the batched variant"):
        get_op("rmsnorm").get("single")(torch.zeros(2, 8), torch.ones(8), 1e-5)
