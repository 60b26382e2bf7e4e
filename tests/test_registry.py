"""The op registry: declaring ops, variants, backends, and clear errors for what is missing."""
from __future__ import annotations

import pytest
import torch

import inspect

import replay
from replay import registry, tolerance
from replay.code import KernelCode
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
    assert scale.get("reference", "cpu") is ref.variant
    assert ref.variant.fn is ref.__wrapped__
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
    assert op.tolerance_for(torch.float32) == tolerance.DEFAULT[torch.float32]
    assert op.tolerance_for(torch.int32) == tolerance.EXACT


def test_provider_import_failure_is_untestable() -> None:
    with pytest.raises(ProviderImportError, match="'no_such_provider_module' failed to import") as info:
        KernelCode(providers=["no_such_provider_module"]).import_provider("no_such_provider_module", "here")
    assert info.value.exit_code == 125
    assert "give --code DIR for the tree that holds 'no_such_provider_module'" in str(info.value)


def test_decorated_variants_keep_their_name_signature_and_docstring() -> None:
    doubler = replay.op("reg_doubler", batch_axes={"x": 0})

    def double(x: torch.Tensor, *, scale: float = 2.0) -> torch.Tensor:
        """Twice x."""
        return x * scale

    for decorate in (doubler.reference, doubler.single, doubler.batched, replay.capture("reg_captured_doubler")):
        wrapped = decorate(double)
        assert wrapped is not double and wrapped.variant.fn is double
        assert (wrapped.__name__, wrapped.__doc__) == ("double", "Twice x.")
        assert inspect.signature(wrapped) == inspect.signature(double)


def test_single_variant_refuses_more_than_one_row() -> None:
    rows = replay.op("reg_rows", batch_axes={"x": 0})

    @rows.single_and_batched
    def plus_one(x):
        return x + 1

    single = rows.get("single")
    assert torch.equal(single(torch.zeros(1, 3)), torch.ones(1, 3))
    assert torch.equal(plus_one(torch.zeros(4, 3)), torch.ones(4, 3))  # the batched variant takes any rows
    with pytest.raises(ValueError, match="reg_rows single: takes one row, got 4; use the batched variant"):
        single(torch.zeros(4, 3))


def test_replacing_swaps_a_variant_for_the_block_only() -> None:
    swapped = replay.op("reg_swapped", batch_axes={"x": 0})

    @swapped.batched
    def right(x):
        return x + 1

    with swapped.replacing("batched", lambda x: x - 1) as wrong:
        assert swapped.get("batched") is wrong.variant
        assert torch.equal(swapped.get("batched")(torch.zeros(2)), -torch.ones(2))
    assert swapped.get("batched") is right.variant


def test_provider_module_moved_inside_its_package_still_provides(tmp_path, monkeypatch) -> None:
    package = tmp_path / "reg_moved_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from reg_moved_pkg import merged  # noqa: F401\n")
    (package / "merged.py").write_text("import replay\nreplay.op('reg_moved_op')\n")
    code = KernelCode(tmp_path, ["reg_missing_pkg"])
    code.import_provider("reg_moved_pkg.old_name", "here")  # recorded before old_name.py was merged
    assert replay.get_op("reg_moved_op").provider == "reg_moved_pkg.merged"
    with pytest.raises(ProviderImportError, match="'reg_missing_pkg.module' failed to import"):
        code.import_provider("reg_missing_pkg.module", "here")


def test_the_readme_lists_every_setting_as_declared() -> None:
    from pathlib import Path

    from replay import settings
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for setting in settings.ALL:
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{setting.name}` |")), None)
        assert row is not None and setting.takes in row and setting.help in row, setting.name
