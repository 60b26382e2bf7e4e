"""Where kernels run: the GPU when there is one, else the Triton interpreter on CPU."""
from __future__ import annotations

import os
import sys
import warnings


def use_interpreter_without_gpu(warn_if_late: bool = False) -> str:
    """Set TRITON_INTERPRET=1 when no CUDA device is present; return 'cuda' or 'cpu'.

    Triton picks the interpreter when a kernel is defined (`@triton.jit`) from this variable, so it
    must be set before triton itself is imported (its own jit functions, tl.sum among them, are made
    then). With `warn_if_late`, a program that imported triton first is told so.
    """
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
        if warn_if_late and "triton" in sys.modules:
            # Triton builds its own library (tl.sum, tl.maximum: jit functions) when it is imported,
            # so a kernel using it fails in the interpreter however late it is defined
            warnings.warn("no GPU here, and triton was imported before replay: Triton's interpreter is chosen as "
                          "triton is imported, so its kernels will fail (\"Cannot call @triton.jit'd outside of the "
                          "scope of a kernel\"); import replay before triton, or set TRITON_INTERPRET=1",
                          stacklevel=3)
    return "cpu"
