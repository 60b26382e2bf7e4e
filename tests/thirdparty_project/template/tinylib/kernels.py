import torch
import triton
import triton.language as tl

# The interpreter (no GPU) has no benchmarker to choose between configs: one config there.
CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 32}, num_warps=4)]


@triton.autotune(configs=CONFIGS if torch.cuda.is_available() else CONFIGS[:1], key=["n_cols"])
@triton.jit
def scale_rows_kernel(x_ptr, scale_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
        tl.store(out_ptr + row * n_cols + cols, x * tl.load(scale_ptr + cols, mask=mask), mask=mask)


@triton.jit
def append_kv_kernel(k_ptr, cache_ptr, position_buf, D: tl.constexpr):
    row = tl.program_id(0)
    position = tl.load(position_buf + row)
    d = tl.arange(0, D)
    tl.store(cache_ptr + position * D + d, tl.load(k_ptr + row * D + d))


def scale_rows(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_rows_kernel[(x.shape[0],)](x, scale, out, x.shape[1])
    return out


def append_kv(k: torch.Tensor, cache: torch.Tensor, position_buf: torch.Tensor) -> None:
    append_kv_kernel[(k.shape[0],)](k, cache, position_buf, D=k.shape[1])
