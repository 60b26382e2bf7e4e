"""PyTorch operator calls as recorded calls (`replay record --torch-ops`).

While a recording with `torch_ops` is active, a TorchDispatchMode sees every operator call that
reaches PyTorch's dispatcher on the thread that started it: aten operators and `torch.library`
custom ops (one call each: what a custom op does inside is its own). Each call that computes
something is recorded like a registered op's: its arguments by their schema names (inputs
before, arguments it writes after), what it returns; views, aliases, factories with no tensor
argument, random draws and uninitialised memory (`empty_like`) are not. Calls made inside a call
being recorded (a registered op's, a Triton launch's, the recorder's own copies) are that call's
business and pass straight through.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from torch.utils._python_dispatch import TorchDispatchMode

from replay.context import launches_wanted, recorder_busy, recorder_work
from replay.recorder.options import RecordingOptions
from replay.recorder.selection import Selection
from replay.recorder.staging import CallSpec
from replay.torch_ops.schema import (OpSchema, as_json_values, expanded, joined, schema_of, split_tensor_lists,
                                     typed)

VARIANT = "torch"


def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` of the recording (record, record_replay) with the operators it runs itself (its
    copies, the function it records) kept out of the torch-op recording."""
    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        with recorder_work():
            return method(*args, **kwargs)
    return run


class TorchOpRecorder(TorchDispatchMode):
    """Hands every recordable operator call to `recording` (a replay.recorder Recording)."""

    def __init__(self, recording: Any, options: RecordingOptions):
        super().__init__()
        self.recording = recording
        self.selection = Selection(options)
        self.on = True  # False once the recording stops, even where the mode cannot be popped
        self.thread = threading.get_ident()  # the only thread whose dispatch stack holds it
        self._schemas: dict[Any, OpSchema] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.on or recorder_busy() or launches_wanted():
            return func(*args, **kwargs)
        schema = self._schemas.get(func)
        if schema is None:
            schema = self._schemas[func] = schema_of(func)
        if not schema.recordable or not self.selection.keeps(schema.name):
            return func(*args, **kwargs)
        try:
            bound = schema.signature.bind(*args, **kwargs)
        except TypeError:  # not as its schema says: let the operator say so
            return func(*args, **kwargs)
        values, lists = split_tensor_lists(dict(bound.arguments))
        values, kinds = as_json_values(values)
        returned: list[Any] = []

        def run(**given: Any) -> Any:
            returned.append(func(**typed(joined(given, lists), kinds)))
            return None if schema.returns_alias else returned[0]  # an in-place op returns what it wrote

        mutates = expanded(schema.mutates, lists)  # a list's tensors, when it writes one
        write_only = expanded(schema.write_only, lists)
        spec = CallSpec(schema.name, VARIANT, schema.provider, mutates=mutates, write_only=write_only,
                        header_extra={"torch_op": {"typed": kinds, "lists": lists, "write_only": list(write_only)}})
        self.recording.record(spec, run, None, (), values)
        return returned[0]
