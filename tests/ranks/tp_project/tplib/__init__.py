"""tplib: the Triton kernels of a tiny tensor-parallel MLP (it knows nothing of kernel-replay)."""
from tplib.kernels import add_position, matmul, matmul_relu

__all__ = ["add_position", "matmul", "matmul_relu"]
