"""Three decode steps of a toy model built on tinylib: scale the hidden rows, append them to a cache."""
import torch

from tinylib import append_kv, scale_rows

device = "cuda" if torch.cuda.is_available() else "cpu"
generator = torch.Generator().manual_seed(0)
scale = torch.rand(32, generator=generator).to(device)
cache = torch.zeros(16, 32, device=device)
for step in range(3):
    hidden = torch.randn(2, 32, generator=generator).to(device)
    out = scale_rows(hidden, scale)
    append_kv(out, cache, torch.tensor([2 * step, 2 * step + 1], dtype=torch.int32, device=device))
print(f"cache checksum {cache.sum().item():.4f}")
