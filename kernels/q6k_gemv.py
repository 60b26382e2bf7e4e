"""q6k_gemv(x [M, K], weight) -> x @ W.T, W in ggml Q6_K super-blocks (210 bytes / 256 weights).

Planted bug "q6k_scale_index" (kernels.bugs): the batched variant reads scale 14 for
sub-block 15 of every super-block.
"""
from kernels.ggml_quant import Q6_K
from kernels.kquant_gemv import declare_kquant_gemv

q6k_gemv, q6k_gemv_reference, q6k_gemv_single, q6k_gemv_batched = declare_kquant_gemv(
    "q6k_gemv", Q6_K, provider=__name__, planted_bug="q6k_scale_index")
