"""One rank of a tensor-parallel MLP block (up projection split by columns, down by rows, an
all_reduce after), timed over BENCH_STEPS steps: what scripts/bench_ranks.py runs under torchrun,
and alone (no WORLD_SIZE) with one rank's shapes for the one-GPU figure. Writes its figures as JSON to
$BENCH_OUT/rank-<r>.json.
BENCH_STALE_RANK=r plants the rank-dependent bug: rank r never moves its position_buf on."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tp_bench_kernels import add_position, matmul

T, H, F = (int(os.environ.get(k, d)) for k, d in (("BENCH_T", "64"), ("BENCH_H", "2048"), ("BENCH_F", "8192")))
STEPS, WARMUP = int(os.environ.get("BENCH_STEPS", "20")), 3
sharded = "WORLD_SIZE" in os.environ
if sharded:
    dist.init_process_group("nccl")
rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
shards = int(os.environ.get("BENCH_SHARDS", world))  # alone: the shapes of one rank of this many
stale = int(os.environ.get("BENCH_STALE_RANK", "-1"))
torch.cuda.set_device(rank)
generator = torch.Generator().manual_seed(0)
w_up = (torch.randn(H, F, generator=generator) / H ** 0.5).to(torch.bfloat16)
w_down = (torch.randn(F, H, generator=generator) / F ** 0.5).to(torch.bfloat16)
up = w_up.chunk(shards, dim=1)[rank].contiguous().cuda()
down = w_down.chunk(shards, dim=0)[rank].contiguous().cuda()
x = torch.randn(T, H, generator=generator).to(torch.bfloat16).cuda()
position_buf = torch.zeros(T, dtype=torch.int32, device="cuda")
positions = torch.arange(T, dtype=torch.int32, device="cuda")


def step(n: int) -> torch.Tensor:
    if rank != stale:
        position_buf.copy_(positions + n * T)
    y = matmul(matmul(add_position(x, position_buf), up), down)
    if sharded:
        dist.all_reduce(y)
    return y


for n in range(WARMUP):
    step(n)
torch.cuda.synchronize()
started = time.perf_counter()
for n in range(STEPS):
    step(WARMUP + n)
torch.cuda.synchronize()
loop = time.perf_counter() - started
replay = sys.modules.get("replay")  # imported first by `replay record`'s sitecustomize when recording
flushed = time.perf_counter()
if replay is not None:
    replay.flush()
flush = time.perf_counter() - flushed
result = json.dumps({"rank": rank, "world": world, "shards": shards, "recorded": replay is not None,
                     "step_ms": loop / STEPS * 1e3, "flush_ms": flush * 1e3})
with open(os.path.join(os.environ.get("BENCH_OUT", "."), f"rank-{rank}.json"), "w") as out:  # ranks print at once
    out.write(result)
if sharded:
    dist.destroy_process_group()
