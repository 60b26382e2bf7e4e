"""What `replay kv-check` needs of a model: a small adapter.

An engine exposes its model to kv-check with an object of this shape (see kernels/kv_adapter.py
for the tiny model's, about thirty lines):

    class MyAdapter:
        vocab: int                        # token ids kv-check may feed are below it
        def reset(self) -> None: ...      # empty the cache and the state buffers
        def prefill(self, tokens: list[int], chunk: int | None) -> torch.Tensor: ...   # logits [T, vocab]
        def decode(self, token: int) -> torch.Tensor: ...                              # logits [vocab]

and records its calls through registered ops (`replay.op`, `@replay.capture`), labelling each
layer's calls with `replay.scope("layer", i)` and each forward pass with `replay.scope("step", n)`.
kv-check reads the KV cache a layer's cache writer (the call that mutates `k_cache` and `v_cache`)
leaves, and the state buffers that call reads, from a recording of each run: nothing else of the
model is assumed. `--model module:factory` names a function `factory(device: str) -> adapter`;
installed packages name theirs in the `replay.models` entry-point group (`tiny` is this project's).
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from types import ModuleType
from typing import Callable, Protocol

import torch

from replay.errors import ReplayError

ENTRY_POINT_GROUP = "replay.models"


class KvAdapter(Protocol):
    vocab: int

    def reset(self) -> None: ...

    def prefill(self, tokens: list[int], chunk: int | None) -> torch.Tensor: ...

    def decode(self, token: int) -> torch.Tensor: ...


def load_factory(spec: str, import_module: Callable[[str], ModuleType] = importlib.import_module
                 ) -> Callable[[str], KvAdapter]:
    """The adapter factory `spec` names: an entry point of `replay.models` (`tiny`), or module:function
    (the module imported by `import_module`: replay.code.KernelCode.module finds it in --code DIR)."""
    declared = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if spec in declared:
        return declared[spec].load()
    module, _, name = spec.partition(":")
    if not name:
        raise ReplayError(f"--model {spec!r}: not a declared model ({', '.join(sorted(declared)) or 'none'}) "
                          "nor module:function")
    try:
        return getattr(import_module(module), name)
    except Exception as exc:  # the user's module failing to import is said in one line
        raise ReplayError(f"--model {spec!r}: {type(exc).__name__}: {exc}") from None
