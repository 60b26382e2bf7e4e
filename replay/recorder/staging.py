"""One walk over a call: its arguments, then its outputs and tags, each tensor handed to a Stage.

A recorded call is described the same way whether it runs now (copied to the host at once) or is
captured into a CUDA graph (staged inside the graph, copied after each replay): only what is done
with each tensor differs, and that is the Stage the caller passes. The walk says each tensor's
key (`in/x`, `state/position_buf`, `out/out`, `tag/rstd`), what it is (for errors), its geometry
(worked out here, once), whether it is read-only (`reusable`: a weight, stored once) and whether
calls write it in place (`persistent`: a KV cache, stored in chunks).
"""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import torch

from replay import binding
from replay.context import CallSink, current_scope, returned_values
from replay.errors import CaptureError
from replay.snapshot import jsonargs
from replay.snapshot.tensors import Geometry, UnsupportedTensor, geometry_of


@dataclass(frozen=True)
class CallSpec:
    """What capture needs to know about the function it records."""

    op: str
    variant: str
    provider: str | None
    state: tuple[str, ...] = ()
    mutates: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    write_only: tuple[str, ...] = ()  # of `mutates`, those the call writes without reading: output buffers
    # more of the call's description, kept in its file as given (a Triton launch's grid and config)
    header_extra: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(slots=True)  # not frozen: made for each tensor of each call, and a frozen one costs twice as much
class Tensor:
    """One tensor of a call, as the walk hands it to a Stage."""

    key: str  # '<role>/<name>'
    what: str  # "argument 'x'", for error messages
    value: torch.Tensor
    geometry: Geometry
    reusable: bool = False  # an input the call only reads: large ones are stored once, as blobs
    persistent: bool = False  # state, or an argument calls write in place: large ones go in chunks
    unread: bool = False  # an output buffer: what it held before is no input but where the call leaves it be


class Stage(Protocol):
    def __call__(self, tensor: Tensor) -> None: ...


def bind(signature: inspect.Signature | None, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, in order, defaults applied; a TypeError where they do not fit
    `signature`. No signature: a call the recorder built itself (a Triton launch, an operator
    call), its values named already in `kwargs` (binding them again cost a launch ~25 us)."""
    if signature is None:
        return kwargs
    return binding.arguments(signature, args, kwargs)


def arguments(spec: CallSpec, bound: Mapping[str, Any], stage: Stage) -> list[dict[str, Any]]:
    """The call's argument list (each a tensor key or a JSON value), every tensor argument staged
    in order; a CaptureError names the op and the argument neither a tensor nor JSON can hold."""
    described: list[dict[str, Any]] = []
    for name, value in bound.items():
        if not isinstance(value, torch.Tensor):
            described.append({"name": name, "json": json_value(spec, f"argument '{name}'", value)})
            continue
        role = "state" if name in spec.state else "in"
        stage(_tensor(spec, f"{role}/{name}", f"argument '{name}'", value,
                      reusable=role == "in" and name not in spec.mutates,
                      persistent=role == "state" or name in spec.mutates,
                      unread=role == "in" and name in spec.write_only))
        described.append({"name": name, "tensor": f"{role}/{name}"})
    return described


def outputs(spec: CallSpec, bound: Mapping[str, Any], result: Any, sink: CallSink, stage: Stage) -> dict[str, Any]:
    """The JSON values the call returned; its tensor outputs, the arguments it mutates and its tags
    staged (a CaptureError if it tagged something that is not a tensor)."""
    if sink.rejected:
        raise CaptureError(f"op '{spec.op}': {sink.rejected[0]}; call not recorded")
    left = returned_values(result, spec.outputs)
    left.update({name: bound[name] for name in spec.mutates if isinstance(bound.get(name), torch.Tensor)})
    returned_json = {}
    for name, value in left.items():
        if isinstance(value, torch.Tensor):
            stage(_tensor(spec, f"out/{name}", f"output '{name}'", value, persistent=name in spec.mutates))
        else:
            returned_json[name] = json_value(spec, f"output '{name}'", value)
    for name, value in sink.tags.items():
        stage(_tensor(spec, f"tag/{name}", f"tag '{name}'", value))
    return returned_json


def header(spec: CallSpec, described: list[dict[str, Any]], returned_json: dict[str, Any],
           launches: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A call's description as its file holds it (the writer adds its index and tensors); `meta`
    as the recorder knows it (timing, memory, stream order), the thread and scope added here."""
    return {"op": spec.op, "variant": spec.variant, "provider": spec.provider, "args": described,
            "returns_json": returned_json, "launch": launches,
            "meta": {**meta, "thread": threading.current_thread().name, "scope": current_scope()},
            **(spec.header_extra or {})}


def mark_written(spec: CallSpec, bound: Mapping[str, Any]) -> None:
    """Move the version counter of every tensor the op says it mutates: a kernel writing through
    a pointer moves none, and a later call reading that tensor must not be given the blob of an
    earlier one (blobs are found again by version)."""
    for name in spec.mutates:
        value = bound.get(name)
        if isinstance(value, torch.Tensor) and not value.is_inference():
            torch.autograd.graph.increment_version(value)


def json_value(spec: CallSpec, what: str, value: Any) -> Any:
    """`value` as JSON, or a CaptureError naming the op and `what`: the call is not recorded."""
    if value is None or type(value) is bool or type(value) is int and -_PLAIN_INT < value < _PLAIN_INT:
        return value  # what a launch passes a dozen of: as jsonargs.encode gives it, without the call
    try:
        return jsonargs.encode(value)
    except jsonargs.NotJSONRepresentable as exc:
        raise CaptureError(f"op '{spec.op}': {what} is neither a tensor nor JSON-representable: "
                           f"{' '.join(str(exc).split())}; call not recorded") from None


_PLAIN_INT = 1 << 62  # within jsonargs.MAX_INT_BITS


def _tensor(spec: CallSpec, key: str, what: str, value: torch.Tensor, reusable: bool = False,
            persistent: bool = False, unread: bool = False) -> Tensor:
    try:
        geometry = geometry_of(value)
    except UnsupportedTensor as exc:
        raise CaptureError(f"op '{spec.op}': {what}: {exc}; call not recorded") from None
    return Tensor(key, what, value, geometry, reusable, persistent, unread)
