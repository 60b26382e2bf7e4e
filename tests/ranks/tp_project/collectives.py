"""Every kind of collective kernel-replay records, once each, on whatever backend the ranks have:
all_reduce (sum and max), broadcast, all_gather into a list and into a tensor, reduce_scatter
(where the backend has it) and a functional all_reduce."""
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

gpus = torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])  # NCCL wants a GPU a rank
dist.init_process_group("nccl" if gpus else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = f"cuda:{rank}" if gpus else "cpu"
x = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3) * 0.1 + rank
dist.all_reduce(x.clone())
dist.all_reduce(x.clone(), op=dist.ReduceOp.MAX)
dist.broadcast(x.clone(), src=world - 1)
dist.all_gather([torch.empty_like(x) for _ in range(world)], x)
dist.all_gather_into_tensor(torch.empty(2 * world, 3, device=device), x)
if dist.get_backend() == "nccl":  # gloo has no reduce_scatter
    dist.reduce_scatter_tensor(torch.empty(2, 3, device=device), torch.cat([x] * world))
funcol.all_reduce(x, "sum", dist.group.WORLD)
dist.destroy_process_group()
