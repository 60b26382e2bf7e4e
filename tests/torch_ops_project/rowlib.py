"""A torch.library custom op with a planted bug: its float32 path (the "fast" one) scales row 2
by the wrong factor; its float64 path is right. Knows nothing of kernel-replay."""
import torch


@torch.library.custom_op("rowlib::rowscale", mutates_args=())
def rowscale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    out = x * scale[:, None]
    if x.dtype == torch.float32 and x.shape[0] > 2:
        out[2] = x[2] * (scale[2] + 1)  # the planted bug
    return out


@rowscale.register_fake
def _(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
