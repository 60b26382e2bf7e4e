"""q4k_gemv(x [M, K], weight) -> x @ W.T, W in ggml Q4_K super-blocks (144 bytes / 256 weights).

See kernels/kquant_matmul.py for the kernel and its row-invariance argument.
"""
from kernels.ggml_quant import Q4_K
from kernels.kquant_gemv import declare_kquant_gemv

q4k_gemv, q4k_gemv_reference, q4k_gemv_single, q4k_gemv_batched = declare_kquant_gemv(
    "q4k_gemv", Q4_K, provider=__name__)
