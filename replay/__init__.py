"""kernel-replay: record kernel calls, replay them against variants, bisect regressions.

The public names load on first use, so commands that need no torch (bisect with
--run, --help) start fast; REPLAY_CAPTURE=path starts a recording at import.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

_PUBLIC = {"capture": "replay.registry", "get_op": "replay.registry", "op": "replay.registry",
           "Tolerance": "replay.registry", "launch": "replay.recorder", "recording": "replay.recorder",
           "tag": "replay.recorder"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if os.environ.get("REPLAY_CAPTURE"):
    importlib.import_module("replay.recorder").start_from_env()
