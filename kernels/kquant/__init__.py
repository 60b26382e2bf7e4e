"""The Q4_K and Q6_K GEMV (ggml's k-quant formats) as one Triton kernel, split by job: walk.py (the K
walk), q4k.py and q6k.py (a step in each format), lanes.py (lane layout, x loads), bits.py (exact
bit-field reads), tile.py (tile policy), matmul.py (the launch), gemv.py (the ops q4k_gemv and
q6k_gemv, registered on import)."""
from replay_kernels.kquant import gemv  # noqa: F401 (registers the ops)
