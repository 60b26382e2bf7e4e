"""A tiny Llama-style decoder built only from the registered kernel ops.

2 layers, hidden 256, 4 query heads and 2 KV heads of 64, SwiGLU FFN of 768, vocabulary 512,
paged KV cache (pages of 16 behind a shuffled block table). Projections are ggml Q4_K
(q, k, o, gate, up) and Q6_K (v, down, lm_head) weights quantised from a fixed-seed numpy
draw, so nothing is downloaded. Activations and cache are fp32 by default.

- prefill(tokens, chunk_size) runs the batched variants over a chunk of rows at a time;
- decode_step(token) runs the single variants on one row, reading the position from the
  persistent position_buf (the indirect kv_scatter path), with seq_len_buf and
  kv_cache_lengths kept on the device: on a GPU the step is captured once into a CUDA graph
  and replayed, the host only refilling token_buf, position_buf and seq_len_buf;
- variants="reference" builds the same model from the reference variants (the oracle).

Prefill hands the (stale, during prefill) position_buf to kv_scatter as state, as a real
engine does; a correct batched kernel ignores it in favour of the direct positions.
Every op call goes through a registered variant, so prefilling inside replay.recording(dir)
writes a real snapshot: see record_prefill.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

import replay
from replay_kernels import OPS, ggml_quant
from replay_kernels.rope import rope_tables


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab: int = 512
    hidden: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    max_seq: int = 128
    page: int = 16
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # Q4_K [heads * head_dim, hidden]
    wk: torch.Tensor  # Q4_K [kv_heads * head_dim, hidden]
    wv: torch.Tensor  # Q6_K [kv_heads * head_dim, hidden]
    wo: torch.Tensor  # Q4_K [hidden, heads * head_dim]
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor  # Q4_K [ffn, hidden]
    w_up: torch.Tensor  # Q4_K [ffn, hidden]
    w_down: torch.Tensor  # Q6_K [hidden, ffn]


@dataclass
class Weights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    out_norm: torch.Tensor
    lm_head: torch.Tensor  # Q6_K [vocab, hidden]


def make_weights(config: TinyLlamaConfig, seed: int, device: torch.device, dtype: torch.dtype) -> Weights:
    """Random weights from numpy's generator seeded with `seed`, projections quantised."""
    rng = np.random.default_rng(seed)

    def quantised(fmt: ggml_quant.QuantFormat, rows: int, cols: int) -> torch.Tensor:
        w = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
        return torch.from_numpy(ggml_quant.QUANTIZERS[fmt.name](w)).to(device)

    def norm() -> torch.Tensor:
        return torch.from_numpy(1.0 + 0.1 * rng.standard_normal(config.hidden)).to(device, dtype)

    c, q4, q6 = config, ggml_quant.Q4_K, ggml_quant.Q6_K
    embed = torch.from_numpy(rng.standard_normal((c.vocab, c.hidden))).to(device, dtype)
    layers = [LayerWeights(norm(), quantised(q4, c.heads * c.head_dim, c.hidden),
                           quantised(q4, c.kv_heads * c.head_dim, c.hidden),
                           quantised(q6, c.kv_heads * c.head_dim, c.hidden),
                           quantised(q4, c.hidden, c.heads * c.head_dim), norm(),
                           quantised(q4, c.ffn, c.hidden), quantised(q4, c.ffn, c.hidden),
                           quantised(q6, c.hidden, c.ffn))
              for _ in range(c.layers)]
    return Weights(embed, layers, norm(), quantised(q6, c.vocab, c.hidden))


def _variants(variant: str, backend: str) -> SimpleNamespace:
    """Every op's `variant` for `backend`; a RegistryError names what exists if one is missing."""
    return SimpleNamespace(**{name: replay.get_op(name).get(variant, backend) for name in OPS})


class TinyLlama:
    def __init__(self, config: TinyLlamaConfig = TinyLlamaConfig(), *, seed: int = 0,
                 device: torch.device | str | None = None, variants: str = "kernels",
                 dtype: torch.dtype = torch.float32, use_cuda_graph: bool | None = None):
        if variants not in ("kernels", "reference"):
            raise ValueError(f"variants must be 'kernels' or 'reference', got {variants!r}")
        self.config = c = config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.weights = make_weights(c, seed, self.device, dtype)
        kernel = variants == "kernels"
        self.prefill_ops = _variants("batched" if kernel else "reference", self.device.type)
        self.decode_ops = _variants("single" if kernel else "reference", self.device.type)
        self.use_cuda_graph = (self.device.type == "cuda" and kernel) if use_cuda_graph is None else use_cuda_graph
        self.cos, self.sin = rope_tables(c.max_seq, c.head_dim, c.rope_theta, self.device)
        pages = c.max_seq // c.page
        cache_shape = (pages, c.page, c.kv_heads, c.head_dim)
        self.k_cache = [torch.zeros(cache_shape, dtype=dtype, device=self.device) for _ in range(c.layers)]
        self.v_cache = [torch.zeros(cache_shape, dtype=dtype, device=self.device) for _ in range(c.layers)]
        gen = torch.Generator().manual_seed(seed)
        self.block_table = torch.randperm(pages, generator=gen).to(torch.int32).to(self.device)
        # persistent device state, as a graph-captured decode step keeps it
        self.kv_cache_lengths = torch.zeros(c.layers, dtype=torch.int32, device=self.device)
        self.position_buf = torch.zeros(c.max_seq, dtype=torch.int32, device=self.device)
        self.seq_len_buf = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.token_buf = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.length = 0  # tokens cached, as the host knows it
        self.steps = 0  # forward passes since the last reset: a recording labels its calls with it
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_logits: torch.Tensor | None = None

    def reset(self) -> None:
        """Empty the cache and the device state (the captured graph stays valid)."""
        for cache in (*self.k_cache, *self.v_cache):
            cache.zero_()
        for buf in (self.kv_cache_lengths, self.position_buf, self.seq_len_buf):
            buf.zero_()
        self.length = self.steps = 0

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, ops: SimpleNamespace,
                 kv_positions: torch.Tensor | None) -> torch.Tensor:
        """Logits [T, vocab] of tokens [T] at positions [T]; writes their K/V into the cache."""
        c, w = self.config, self.weights
        h = w.embed[tokens]
        for i, layer in enumerate(w.layers):
            with replay.scope("layer", i):
                h = self._layer(i, layer, h, positions, ops, kv_positions)
        return ops.q6k_gemv(ops.rmsnorm(h, w.out_norm, c.eps), w.lm_head)

    def _layer(self, i: int, layer: LayerWeights, h: torch.Tensor, positions: torch.Tensor, ops: SimpleNamespace,
               kv_positions: torch.Tensor | None) -> torch.Tensor:
        c, t = self.config, h.shape[0]
        a = ops.rmsnorm(h, layer.attn_norm, c.eps)
        q = ops.rope(ops.q4k_gemv(a, layer.wq).view(t, c.heads, c.head_dim), positions, self.cos, self.sin, "neox")
        k = ops.rope(ops.q4k_gemv(a, layer.wk).view(t, c.kv_heads, c.head_dim), positions, self.cos, self.sin,
                     "neox")
        v = ops.q6k_gemv(a, layer.wv).view(t, c.kv_heads, c.head_dim)
        ops.kv_scatter(k, v, self.k_cache[i], self.v_cache[i], self.kv_cache_lengths[i:i + 1],
                       self.position_buf, self.seq_len_buf, positions=kv_positions, block_table=self.block_table)
        o = ops.attention(q, self.k_cache[i], self.v_cache[i], positions, self.block_table, c.head_dim ** -0.5)
        h = ops.residual_add(h, ops.q4k_gemv(o.view(t, c.heads * c.head_dim), layer.wo))
        f = ops.rmsnorm(h, layer.ffn_norm, c.eps)
        g = ops.swiglu(ops.q4k_gemv(f, layer.w_gate), ops.q4k_gemv(f, layer.w_up))
        h = ops.residual_add(h, ops.q6k_gemv(g, layer.w_down))
        return h

    def prefill(self, tokens: Sequence[int], chunk_size: int | None = None) -> torch.Tensor:
        """Logits [T, vocab] of the prompt, `chunk_size` rows per batched call (all at once by default)."""
        ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=self.device)
        chunk = chunk_size or len(ids)
        self._check_room(len(ids))
        logits = []
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            positions = torch.arange(self.length, self.length + len(part), dtype=torch.int32, device=self.device)
            self.seq_len_buf.fill_(len(part))
            with replay.scope("step", self.steps):
                logits.append(self._forward(part, positions, self.prefill_ops, kv_positions=positions))
            self.length += len(part)
            self.steps += 1
        return torch.cat(logits)

    def decode_step(self, token: int) -> torch.Tensor:
        """Logits [vocab] of one token at the next position, through the persistent buffers."""
        self._check_room(1)
        self.token_buf.fill_(token)
        self.position_buf[:1].fill_(self.length)
        self.seq_len_buf.fill_(1)
        if not self.use_cuda_graph:
            logits = self._decode_forward()
        elif self._graph is None or replay.recapture_needed(self._graph):
            # runs the step for real and compiles every kernel; captured again when a recording starts
            # (so that it follows the graph: replay/recorder/graphs.py) or has ended (its copies go)
            logits = self._decode_forward()
            self._capture()
        else:
            with replay.scope("step", self.steps):  # a replay's calls are labelled with the step it runs
                self._graph.replay()
            logits = self._graph_logits
        self.length += 1
        self.steps += 1
        return logits[0]

    def _decode_forward(self) -> torch.Tensor:
        with replay.scope("step", self.steps):
            return self._forward(self.token_buf, self.position_buf[:1], self.decode_ops, kv_positions=None)

    def _capture(self) -> None:
        torch.cuda.synchronize(self.device)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._graph_logits = self._decode_forward()

    def _check_room(self, n: int) -> None:
        if self.length + n > self.config.max_seq:
            raise ValueError(f"KV cache holds {self.config.max_seq} positions: {self.length} used, {n} more asked")

    def generate(self, prompt: Sequence[int], new_tokens: int, chunk_size: int | None = None) -> list[int]:
        """Greedy continuation of `prompt` by `new_tokens` tokens, from an empty cache."""
        self.reset()
        token = int(self.prefill(prompt, chunk_size)[-1].argmax())
        out = [token]
        while len(out) < new_tokens:
            token = int(self.decode_step(token).argmax())
            out.append(token)
        return out


def prompt_tokens(length: int, seed: int = 0, vocab: int = TinyLlamaConfig.vocab) -> list[int]:
    """A fixed pseudo-random prompt."""
    return np.random.default_rng(seed + 1).integers(0, vocab, length).tolist()


def run_generation(prompt_len: int = 8, new_tokens: int = 4, *, seed: int = 0, variants: str = "kernels",
                   device: str | None = None, chunk_size: int | None = None) -> list[int]:
    """Build the model and greedily generate `new_tokens` tokens after a `prompt_len` prompt."""
    model = TinyLlama(seed=seed, device=device, variants=variants)
    return model.generate(prompt_tokens(prompt_len, seed), new_tokens, chunk_size)


def record_prefill(out_dir: str | Path, *, prompt_len: int = 8, seed: int = 0, chunk_size: int | None = None,
                   device: str | None = None, notes: str = "") -> Path:
    """Record one prefill of the kernel model into a new snapshot at `out_dir`; returns its path.

    A faulty variant swapped in at the time is what gets recorded.
    """
    model = TinyLlama(seed=seed, device=device)
    prompt = prompt_tokens(prompt_len, seed)
    with replay.recording(out_dir, notes=notes or f"tiny llama prefill: {prompt_len} tokens, seed {seed}") as rec:
        model.prefill(prompt, chunk_size)
    return rec.path
