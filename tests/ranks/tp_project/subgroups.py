"""Two groups of two ranks (a 2x2 layout: tensor parallel within [0, 1] and [2, 3]), each making an
all_reduce of its own: the groups' results differ by design."""
import os

import torch
import torch.distributed as dist

gpus = torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])  # NCCL wants a GPU a rank
dist.init_process_group("nccl" if gpus else "gloo")
rank = dist.get_rank()
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
x = torch.full((2, 2), float(rank), device=f"cuda:{rank}" if gpus else "cpu")
dist.all_reduce(x, group=groups[rank // 2])
dist.all_reduce(x)  # and one over the whole world
dist.destroy_process_group()
