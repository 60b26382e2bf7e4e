"""Triton kernels for LLM inference, each registered as a replay op with reference, single
and batched variants; importing the package registers them all. See docs/KERNELS.md.

Without a GPU the kernels run in the Triton interpreter, which must be chosen before they are
defined: `import replay`, first here, does that.
"""
import replay  # noqa: F401 (before the kernels: picks Triton's interpreter where there is no GPU)
from replay_kernels import attention, kquant, kv_scatter, residual_add, rmsnorm, rope, swiglu  # noqa: E402,F401
from replay_kernels import det_gemm, examples, torch_matmul  # noqa: E402,F401 (after the ops: examples registers theirs)

OPS = ("rmsnorm", "residual_add", "rope", "swiglu", "q4k_gemv", "q6k_gemv", "kv_scatter", "attention")
