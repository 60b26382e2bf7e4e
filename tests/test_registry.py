"""The op registry: declaring ops, variants, backends, and clear errors for what is missing."""
from __future__ import annotations

import pytest
import torch

import replay
from replay import registry
from replay.errors import ProviderImportError, RegistryError


@pytest.fixture(autouse=True)
def clean_registry():
    saved = dict(registry._OPS)
    yield
    registry._OPS.clear()
    registry._OPS.update(saved)


def test_variants_register_with_backends_and_provider() -> None:
    scale = replay.op("reg_scale", batch_axes={"x": 0})

    @scale.reference
    def ref(x):
        return x * 2

    @scale.variant("cuda_only", backends=("cuda",))
    def fast(x):
        return x * 2

    assert scale.provider == __name__
    assert scale.get("reference", "cpu").fn is ref.fn
    assert torch.equal(ref(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(RegistryError, match=r"variant 'cuda_only' cannot run on backend 'cpu' \(it runs on: cuda\)"):
        scale.get("cuda_only", "cpu")
    with pytest.raises(RegistryError, match=r"has no variant 'batched' \(it has: reference, cuda_only\)"):
        scale.get("batched")


def test_unknown_op_lists_registered_ones() -> None:
    replay.op("reg_known")
    with pytest.raises(RegistryError, match="(?s)unknown op .reg_missing.*reg_known"):
        replay.get_op("reg_missing")


def test_unknown_backend_rejected_at_registration() -> None:
    with pytest.raises(RegistryError, match="unknown backend"):
        replay.op("reg_backend").variant("x", backends=("tpu",))


def test_op_name_owned_by_one_module() -> None:
    replay.op("reg_owned")
    with pytest.raises(RegistryError, match="already declared by module"):
        replay.op("reg_owned", provider="somebody.else")


def test_capture_declares_op_and_rejects_conflicting_layout() -> None:
    @replay.capture("reg_captured", variant="mine", mutates=("buf",))
    def fill(buf):
        buf.fill_(1)

    assert replay.get_op("reg_captured").mutates == ("buf",)
    with pytest.raises(RegistryError, match="asks for state=\\(\\), mutates=\\('other',\\)"):
        @replay.capture("reg_captured", variant="theirs", mutates=("other",))
        def fill_other(other):
            other.fill_(2)


def test_tolerance_per_dtype_with_defaults() -> None:
    op = replay.op("reg_tol", tolerance={torch.bfloat16: replay.Tolerance(0.1, 0.1)})
    assert op.tolerance_for(torch.bfloat16) == replay.Tolerance(0.1, 0.1)
    assert op.tolerance_for(torch.float32) == registry.DEFAULT_TOLERANCES[torch.float32]
    assert op.tolerance_for(torch.int32) == registry.EXACT


def test_provider_import_failure_is_untestable() -> None:
    with pytest.raises(ProviderImportError, match="'no_such_provider_module' failed to import") as info:
        registry.load_provider("no_such_provider_module")
    assert info.value.exit_code == 125
