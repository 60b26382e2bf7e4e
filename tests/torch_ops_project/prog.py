"""A program using rowlib and plain PyTorch: views, in-place updates, a list argument."""
import torch

import rowlib

x = torch.arange(24.0).view(4, 6)
scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
y = rowlib.rowscale(x, scale)
y[:, 1:3].mul_(0.5)  # in place, on a view
z = torch.cat([y.t(), x.t()], dim=1).sum(dim=0)
print(" ".join(f"{v:g}" for v in z.tolist()))
