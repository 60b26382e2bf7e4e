"""A tiny tensor-parallel MLP: the up projection split by columns over the ranks, the down projection
by rows, an all_reduce after; run alone (no torchrun) it is the same model unsharded. Three steps,
each adding a position term read from position_buf, the runtime state the host moves on.

    torchrun --nproc-per-node 2 mlp.py      # sharded over 2 ranks (gloo, or nccl on GPUs)
    python mlp.py                           # unsharded
TP_STALE_RANK=1 plants a rank-dependent bug: that rank never moves its position_buf on.
"""
import os

import torch
import torch.distributed as dist

T, H, F, STEPS = 4, 16, 32, 3
sharded = "WORLD_SIZE" in os.environ
gpus = torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", "1"))  # NCCL wants a GPU a rank
if not gpus and torch.cuda.device_count():  # Triton, imported with torch, stays in GPU mode
    raise SystemExit("mlp.py: needs a GPU a rank (NCCL), or no GPU at all (gloo, the Triton interpreter)")
if not gpus:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: CPU tensors, the interpreter
from tplib import add_position, matmul, matmul_relu  # noqa: E402

if sharded:
    dist.init_process_group("nccl" if gpus else "gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
device = f"cuda:{rank}" if gpus else "cpu"
stale_rank = int(os.environ.get("TP_STALE_RANK", "-1"))
generator = torch.Generator().manual_seed(0)
w_up, w_down = torch.randn(H, F, generator=generator) / 4, torch.randn(F, H, generator=generator) / 4
up = w_up.chunk(world, dim=1)[rank].contiguous().to(device)
down = w_down.chunk(world, dim=0)[rank].contiguous().to(device)
x = torch.randn(T, H, generator=generator).to(device)
position_buf = torch.zeros(T, dtype=torch.int32, device=device)
for step in range(STEPS):
    if rank != stale_rank:
        position_buf.copy_(torch.arange(T, dtype=torch.int32) + step * T)
    h = matmul_relu(add_position(x, position_buf), up)
    y = matmul(h, down)
    if sharded:
        dist.all_reduce(y)
    x = y
print(f"rank {rank}: checksum {x.sum().item():.6f}")
if sharded:
    dist.destroy_process_group()
