"""Where kernels run: the GPU when there is one, else the Triton interpreter on CPU."""
from __future__ import annotations

import os


def use_interpreter_without_gpu() -> str:
    """Set TRITON_INTERPRET=1 when no CUDA device is present; return 'cuda' or 'cpu'.

    Must run before triton is first imported: the interpreter is chosen at import.
    """
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return "cpu"
