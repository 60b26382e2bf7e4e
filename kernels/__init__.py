"""Triton kernels for LLM inference, each registered as a replay op with reference, single
and batched variants; importing the package registers them all. See docs/KERNELS.md.

Without a GPU the kernels run in the Triton interpreter, which must be chosen before triton
is first imported: importing this package first does that.
"""
from replay.device import use_interpreter_without_gpu

use_interpreter_without_gpu()

from kernels import attention, kquant_gemv, kv_scatter, residual_add, rmsnorm, rope, swiglu  # noqa: E402,F401
from kernels import det_gemm, examples, torch_matmul  # noqa: E402,F401 (after the ops: examples registers theirs)

OPS = ("rmsnorm", "residual_add", "rope", "swiglu", "q4k_gemv", "q6k_gemv", "kv_scatter", "attention")
