"""A llama-style block on Liger-Kernel, knowing nothing of kernel-replay: RMSNorm, RoPE, SwiGLU and
cross-entropy, forward and backward."""
import sys

import torch
from liger_kernel.transformers.functional import liger_cross_entropy, liger_rms_norm, liger_rope, liger_swiglu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# python block.py [TOKENS HIDDEN HEADS FFN VOCAB]: the shapes (scripts/bench_launches.py passes larger ones)
TOKENS, HIDDEN, HEADS, FFN, VOCAB = (int(v) for v in sys.argv[1:6]) if len(sys.argv) > 5 else (8, 64, 2, 128, 96)
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
# Triton's interpreter (no GPU) cannot run Liger's RMSNorm and SwiGLU: they call `.to()` on a float
# argument, which the interpreter passes as a Python float. There, torch stands in for those two.
ON_INTERPRETER = DEVICE == "cpu"


def rms_norm(x, w, eps):
    if ON_INTERPRETER:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return liger_rms_norm(x, w, eps)


def swiglu(a, b):
    return torch.nn.functional.silu(a) * b if ON_INTERPRETER else liger_swiglu(a, b)
HEAD_DIM = HIDDEN // HEADS


def weights(gen):
    make = lambda *shape: (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(DEVICE, DTYPE).requires_grad_()
    return {"norm": torch.ones(HIDDEN, device=DEVICE, dtype=DTYPE, requires_grad=True),
            "qk": make(2 * HIDDEN, HIDDEN), "gate": make(FFN, HIDDEN), "up": make(FFN, HIDDEN),
            "down": make(HIDDEN, FFN), "head": make(VOCAB, HIDDEN)}


def rope_tables():
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    angles = torch.outer(torch.arange(TOKENS).float(), inv)
    emb = torch.cat([angles, angles], dim=-1)[None]
    return emb.cos().to(DEVICE, DTYPE), emb.sin().to(DEVICE, DTYPE)


def step(w, x, target, cos, sin):
    h = rms_norm(x, w["norm"], 1e-6)
    q, k = (h @ w["qk"].t()).view(1, TOKENS, 2, HEADS, HEAD_DIM).unbind(2)
    q, k = liger_rope(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), cos, sin)
    h = h + (q + k).transpose(1, 2).reshape(1, TOKENS, HIDDEN)
    h = h + swiglu(h @ w["gate"].t(), h @ w["up"].t()) @ w["down"].t()
    loss = liger_cross_entropy((h @ w["head"].t()).view(TOKENS, VOCAB).float(), target)
    loss.backward()
    return loss


def main():
    gen = torch.Generator().manual_seed(0)
    w = weights(gen)
    cos, sin = rope_tables()
    for _ in range(2):
        x = torch.randn(1, TOKENS, HIDDEN, generator=gen).to(DEVICE, DTYPE)
        target = torch.randint(0, VOCAB, (TOKENS,), generator=gen).to(DEVICE)
        print(f"loss {step(w, x, target, cos, sin).item():.6f}")
    print("grad norms", " ".join(f"{n}={p.grad.float().norm().item():.6f}" for n, p in w.items()))


if __name__ == "__main__":
    main()
