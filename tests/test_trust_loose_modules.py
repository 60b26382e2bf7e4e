"""Which loose modules under `--code DIR` a snapshot may name (replay/trust.py): those that declare
ops or Triton kernels, read from their text and syntax; never another script of the tree."""
from __future__ import annotations

from pathlib import Path

import pytest

from replay.trust import ProviderTrust, declares_ops

KERNEL = "import triton\nimport triton.language as tl\n\n\n{decorator}\ndef k(x_ptr, BLOCK: tl.constexpr):\n    pass\n"
MODULES = {
    "plain_jit": (KERNEL.format(decorator="@triton.jit"), True),
    "jit_imported_by_name": (KERNEL.replace("import triton\n", "from triton import jit\n").format(decorator="@jit"),
                             True),
    "autotuned": (KERNEL.format(decorator="@triton.autotune(configs=[], key=[])\n@triton.jit"), True),
    "registers_an_op": ("import replay\nscale = replay.op('scale')\n", True),
    "names_triton_jit_in_a_comment": ("import triton\n# kernels are @triton.jit functions elsewhere\nprint('hi')\n",
                                      False),
    "names_it_in_a_string": ("import triton\nHELP = '@triton.jit'\n", False),
    "jit_without_triton": ("from numba import jit\n\n\n@jit\ndef f(x):\n    return x\n", False),
    "not_python": ("@triton.jit def (:\n", False),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_a_loose_module_is_trusted_under_code_dir_only_if_it_declares_ops_or_kernels(tmp_path: Path, name: str) -> None:
    text, trusted = MODULES[name]
    (tmp_path / f"{name}.py").write_text(text)
    assert declares_ops(tmp_path / f"{name}.py") is trusted
    assert ProviderTrust.of(code_dir=tmp_path).allows(name) is trusted
