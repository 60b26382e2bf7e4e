"""tinylib: two Triton kernels, as a kernel library ships them (it knows nothing of kernel-replay)."""
from tinylib.kernels import append_kv, scale_rows

__all__ = ["append_kv", "scale_rows"]
