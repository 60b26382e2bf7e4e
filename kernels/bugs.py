"""Planted bugs: faulty variants and models that prove the checks can fail, kept out of the kernels.

Each op bug is a wrong implementation of one variant of one op. `planting(name)` registers it
in place of the real variant for the duration of a block (a test), then puts the real one
back; nothing in the kernels knows about it. All are in batched variants, so they show as
batched-vs-single divergences. The demo's planted commit writes the kv_scatter one into
kernels/kv_scatter.py (replay/demo.py).

The model bugs are TinyLlama subclasses that get the serving state wrong, the class `replay
kv-check` exists to catch (MODEL_BUGS; kernels/kv_adapter.py's adapter_of drives one).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

import replay
from replay_kernels import det_gemm
from replay_kernels.ggml_quant import Q6_K
from replay_kernels.kquant.matmul import BATCHED_BLOCK_M, kquant_matmul
from replay_kernels.kv_scatter import scatter
from replay_kernels.rmsnorm import rmsnorm_rows
from replay_kernels.model import TinyLlama

# where a Q6_K super-block keeps its 16 int8 sub-block scales (after ql [128] and qh [64])
_Q6K_SCALES = 192


def q6k_gemv_batched_wrong_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Batched Q6_K GEMV that dequantises sub-block 15 of every super-block with scale 14."""
    blocks = weight.clone(memory_format=torch.contiguous_format)
    per_block = blocks.view(blocks.shape[0], -1, Q6_K.block_bytes)
    per_block[:, :, _Q6K_SCALES + 15] = per_block[:, :, _Q6K_SCALES + 14]
    return kquant_matmul(x, blocks, Q6_K, block_m=BATCHED_BLOCK_M)


def kv_scatter_graph_ready(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           kv_cache_lengths: torch.Tensor, position_buf: torch.Tensor, seq_len_buf: torch.Tensor,
                           positions: torch.Tensor | None = None, block_table: torch.Tensor | None = None) -> None:
    """One path for eager and graph-captured prefill: positions always come from position_buf."""
    scatter(k, v, k_cache, v_cache, kv_cache_lengths, position_buf, seq_len_buf, positions, block_table,
            indirect=True)


def rmsnorm_weight_saturates(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Batched rmsnorm whose weights saturate at 2.0, as one storing them in a narrow fixed-point format
    would: right for every layer whose norm weights stay below 2, a little wrong in one that has a larger one."""
    return rmsnorm_rows(x, weight.clamp(max=2.0), eps)


def det_gemm_split_k(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """det_gemm with split-K past four rows, as a library does to fill the GPU: two halves of K, each
    rounded to the output dtype, added, so a row's sum depends on the batch it rides in."""
    if x.shape[0] <= 4:
        return det_gemm.matmul(x, weight.t())
    half = x.shape[1] // 2
    return det_gemm.matmul(x[:, :half], weight[:, :half].t()) + det_gemm.matmul(x[:, half:], weight[:, half:].t())


class _SplitMWeightGrad(det_gemm.DetLinear):
    """DetLinear whose weight gradient, past four rows, adds two halves of the batch, each rounded to
    the input dtype, as a split reduction over M with partials in the output dtype does: zero
    padding moves the split and changes the sum."""

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        grad_out = grad_out.to(x.dtype)
        dw = det_gemm.matmul(grad_out.t(), x)
        if x.shape[0] > 4:
            half = x.shape[0] // 2
            dw = det_gemm.matmul(grad_out[:half].t(), x[:half]) + det_gemm.matmul(grad_out[half:].t(), x[half:])
        return det_gemm.matmul(grad_out, weight), dw


def det_gemm_split_m_backward(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return _SplitMWeightGrad.apply(x, weight)


@dataclass(frozen=True)
class Bug:
    op: str
    variant: str
    fn: Callable[..., Any]
    what: str


BUGS = {
    "q6k_scale_index": Bug("q6k_gemv", "batched", q6k_gemv_batched_wrong_scale,
                           "batched q6k_gemv dequantises sub-block 15 of every super-block with scale 14"),
    "det_gemm_split_k": Bug("det_gemm", "batched", det_gemm_split_k,
                            "batched det_gemm splits K in two past four rows, so rows change with the batch"),
    "det_gemm_split_m_backward": Bug("det_gemm", "batched", det_gemm_split_m_backward,
                                     "batched det_gemm's weight gradient adds two halves of the batch past four "
                                     "rows, so zero padding changes it"),
    "rmsnorm_weight_saturates": Bug("rmsnorm", "batched", rmsnorm_weight_saturates,
                                    "batched rmsnorm clamps its weights at 2.0, wrong only where a layer's norm "
                                    "weight is larger"),
    "kv_scatter_stale_position_buf": Bug("kv_scatter", "batched", kv_scatter_graph_ready,
                                         "batched kv_scatter reads position_buf even when positions are given, so "
                                         "a prefill scatters every token where a stale position_buf points"),
}


@contextlib.contextmanager
def planting(*names: str) -> Iterator[None]:
    """Swap the named bugs' faulty variants in for the block; the real ones come back after it.

    Example:
        with bugs.planting("q6k_scale_index"):
            report = check_arguments(replay.get_op("q6k_gemv"), args, options)
    """
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise KeyError(f"no planted bug named {unknown[0]!r}; known: {sorted(BUGS)}")
    with contextlib.ExitStack() as stack:
        for name in names:
            bug = BUGS[name]
            stack.enter_context(replay.get_op(bug.op).replacing(bug.variant, bug.fn))
        yield


class GraphReadyPrefill(TinyLlama):
    """Prefill through the indirect path, as a CUDA-graph-ready engine might: the kernels read
    position_buf, which only a decode step writes (one slot), so a prefill after a reset or a
    decode finds it stale and scatters its tokens to wrong positions."""

    def prefill(self, tokens, chunk_size=None):
        ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=self.device)
        positions = torch.arange(self.length, self.length + len(ids), dtype=torch.int32, device=self.device)
        self.seq_len_buf.fill_(len(ids))
        with replay.scope("step", self.steps):
            logits = self._forward(ids, positions, self.prefill_ops, kv_positions=None)
        self.length += len(ids)
        self.steps += 1
        return logits


class StaleSeqLenDecode(TinyLlama):
    """A decode step that never refreshes seq_len_buf: after a prefill of T tokens each step
    advances kv_cache_lengths by T; after a reset (seq_len_buf 0) by nothing."""

    def decode_step(self, token):
        self._check_room(1)
        self.token_buf.fill_(token)
        self.position_buf[:1].fill_(self.length)
        logits = self._decode_forward()  # seq_len_buf still holds what the last prefill (or reset) left
        self.length += 1
        self.steps += 1
        return logits[0]


class ChunkOffsetPrefill(TinyLlama):
    """A chunked prefill that offsets each chunk by the previous chunk's length instead of the
    tokens already cached: with chunks of equal size it is right until the chunk after the second."""

    def prefill(self, tokens, chunk_size=None):
        ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=self.device)
        chunk = chunk_size or len(ids)
        logits, previous = [], 0
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            positions = torch.arange(previous, previous + len(part), dtype=torch.int32, device=self.device)
            self.seq_len_buf.fill_(len(part))
            with replay.scope("step", self.steps):
                logits.append(self._forward(part, positions, self.prefill_ops, kv_positions=positions))
            self.length += len(part)
            self.steps += 1
            previous = len(part)
        return torch.cat(logits)


MODEL_BUGS: dict[str, type[TinyLlama]] = {
    "prefill_stale_position_buf": GraphReadyPrefill,
    "decode_stale_seq_len": StaleSeqLenDecode,
    "chunk_offset": ChunkOffsetPrefill,
}
