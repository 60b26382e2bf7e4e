"""The tiny model's adapter for `replay kv-check` (replay/kv/adapter.py says what one is)."""
from __future__ import annotations

from typing import Callable

import torch

from replay_kernels.model import TinyLlama


class TinyLlamaAdapter:
    """kv-check's view of a TinyLlama: its prefill and decode step, nothing else."""

    def __init__(self, model: TinyLlama):
        self.model = model
        self.vocab = model.config.vocab

    def reset(self) -> None:
        self.model.reset()

    def prefill(self, tokens: list[int], chunk: int | None) -> torch.Tensor:
        return self.model.prefill(tokens, chunk)

    def decode(self, token: int) -> torch.Tensor:
        return self.model.decode_step(token)


def adapter_of(model_class: type[TinyLlama]) -> Callable[[str], TinyLlamaAdapter]:
    """A kv-check factory for a TinyLlama (sub)class: device -> adapter."""
    return lambda device: TinyLlamaAdapter(model_class(device=device))


tiny = adapter_of(TinyLlama)
