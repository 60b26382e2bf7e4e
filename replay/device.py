"""Where kernels run: the GPU when there is one, else the Triton interpreter on CPU."""
from __future__ import annotations

import os
import sys
import warnings


def use_interpreter_without_gpu(warn_if_late: bool = False) -> str:
    """Set TRITON_INTERPRET=1 when no CUDA device is present; return 'cuda' or 'cpu'.

    Triton picks the interpreter when a kernel is defined (`@triton.jit`) from this variable, so it
    must be set before the kernels' modules are imported. With `warn_if_late`, a program that
    imported triton first is told so (its earlier kernels would look for a GPU driver).
    """
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
        if warn_if_late and "triton" in sys.modules:
            warnings.warn("no GPU here, and triton was imported before replay: kernels defined before `import "
                          "replay` need TRITON_INTERPRET=1 set before triton is imported", stacklevel=3)
    return "cpu"
