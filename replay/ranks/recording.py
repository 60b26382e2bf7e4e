"""torch.distributed collectives as recorded calls, while a recording is active.

all_reduce, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor and
broadcast, through torch.distributed and through the functional collectives, are wrapped: each
call is recorded like a kernel call, its tensors before as inputs and what it wrote (or returned)
after as outputs, with a `collective` header saying the kind, the reduce op, the group's global
ranks and this rank. An asynchronous collective (async_op=True, a functional collective's lazy
tensor) is waited for inside the call so that what is recorded is what it made: recording a
collective orders it as a synchronous one would. The first collective of each group also writes
the backend and the groups met so far into the manifest's `distributed`.

A rank replayed alone cannot run its collectives again (the other ranks are not there): they are
checked across ranks from the recorded inputs of every member (replay/ranks/collective_check.py).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from replay.context import recorder_busy
from replay.ranks.layout import RankInfo
from replay.recorder.staging import CallSpec

OP_PREFIX = "torch.distributed."  # the op names of recorded collectives: torch.distributed.all_reduce
VARIANT = "collective"
_REDUCE_NAMES = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def is_collective_op(op: str) -> bool:
    return op.startswith(OP_PREFIX)


@dataclass(frozen=True)
class _Call:
    """One collective call taken apart: the tensors it reads and writes by name, how to run it."""

    kind: str
    reads: dict[str, torch.Tensor]
    writes: dict[str, torch.Tensor]  # written in place (empty for a functional collective, which returns)
    run: Callable[[dict[str, torch.Tensor]], Any]  # given the tensors by name, runs the collective
    group: Any  # the ProcessGroup (or a functional collective's group spec)
    extra: dict[str, Any]  # reduce_op, src, dim


class CollectiveRecorder:
    """Wraps torch.distributed's collectives for `recording` (a replay.recorder Recording) until
    uninstall()."""

    def __init__(self, recording: Any, rank: RankInfo | None):
        self.recording = recording
        self.rank = rank
        self._originals: list[tuple[Any, str, Any]] = []
        self._groups: dict[tuple[int, ...], str] = {}  # global ranks -> backend, as noted in the manifest

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        for module, name, take_apart in ((dist, "all_reduce", _all_reduce), (dist, "broadcast", _broadcast),
                                         (dist, "all_gather", _all_gather),
                                         (dist, "all_gather_into_tensor", _all_gather_into_tensor),
                                         (dist, "reduce_scatter", _reduce_scatter),
                                         (dist, "reduce_scatter_tensor", _reduce_scatter_tensor),
                                         (funcol, "all_reduce", _functional_all_reduce),
                                         (funcol, "all_gather_tensor", _functional_all_gather),
                                         (funcol, "reduce_scatter_tensor", _functional_reduce_scatter)):
            original = getattr(module, name, None)
            if original is None:
                continue
            self._originals.append((module, name, original))
            setattr(module, name, self._wrap(name, original, take_apart, api=f"{module.__name__}.{name}"))

    def uninstall(self) -> None:
        while self._originals:
            module, name, original = self._originals.pop()
            setattr(module, name, original)

    def _wrap(self, name: str, original: Callable[..., Any], take_apart: Callable[..., _Call | None],
              api: str) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if recorder_busy() or self.recording.stopped:  # inside a recorded call: that call's business
                return original(*args, **kwargs)
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)
            bound.apply_defaults()
            call = take_apart(original, bound.arguments)
            if call is None:  # a form not recorded (an object collective, a coalesced list)
                return original(*args, **kwargs)
            return self._record(call, api)
        return collective

    def _record(self, call: _Call, api: str) -> Any:
        ranks = _group_ranks(call.group)
        self._note_group(call.group, ranks)
        header = {"kind": call.kind, "group": list(ranks) if ranks is not None else [], "api": api, **call.extra}
        if self.rank is not None:
            header["rank"] = self.rank.rank
        returned: list[Any] = []

        def run(**given: torch.Tensor) -> Any:
            returned.append(call.run(given))
            return returned[0] if not call.writes else None  # what it wrote is recorded as outputs

        spec = CallSpec(OP_PREFIX + call.kind, VARIANT, None, mutates=tuple(call.writes),
                        outputs=() if call.writes else ("out",), header_extra={"collective": header})
        tensors = {**call.reads, **call.writes}
        self.recording.record(spec, run, None, (), tensors)
        return returned[0] if returned else None

    def _note_group(self, group: Any, ranks: tuple[int, ...] | None) -> None:
        """The first collective of a group writes the groups met so far into the manifest."""
        if ranks is None or ranks in self._groups:
            return
        self._groups[ranks] = _backend(group)
        distributed = {**(self.rank.to_json() if self.rank is not None else {}),
                       "backend": self._groups.get(ranks), "groups": [{"ranks": list(r), "backend": b}
                                                                       for r, b in self._groups.items()]}
        self.recording.writer.set_manifest_field("distributed", distributed)


def _waited(work: Any) -> Any:
    """An asynchronous collective's work, finished: what it wrote is then what is recorded."""
    if work is not None and hasattr(work, "wait"):
        work.wait()
    return work


def _reduce_name(op: Any) -> str:
    import torch.distributed as dist

    if isinstance(op, str):
        return op.lower()
    for name in _REDUCE_NAMES:
        if op == getattr(dist.ReduceOp, name.upper(), None):
            return name
    return "premul_sum"  # a sum of terms scaled by a factor the call does not say: recorded, not checked


def _group_ranks(group: Any) -> tuple[int, ...] | None:
    """The global ranks of `group` (None: the default group; a functional collective's list of
    ranks, a mesh), or None where it cannot be told."""
    import torch.distributed as dist

    try:
        if isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group):
            return tuple(group)
        if group is None or isinstance(group, dist.ProcessGroup):
            return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        from torch.distributed._functional_collectives import _resolve_group_name
        from torch.distributed.distributed_c10d import _resolve_process_group

        return tuple(dist.get_process_group_ranks(_resolve_process_group(_resolve_group_name(group))))
    except (RuntimeError, ValueError, TypeError, AttributeError, ImportError):
        return None


def _backend(group: Any) -> str:
    import torch.distributed as dist

    try:
        return str(dist.get_backend(group if isinstance(group, dist.ProcessGroup) else None))
    except (RuntimeError, ValueError, TypeError):
        return "unknown"


def _tensor_list(name: str, tensors: Any) -> dict[str, torch.Tensor] | None:
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    return {f"{name}_{i}": t for i, t in enumerate(tensors)}


# each collective taken apart: None for a form left unrecorded ---------------------------------------

def _all_reduce(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    if not isinstance(a["tensor"], torch.Tensor):
        return None
    return _Call("all_reduce", {}, {"tensor": a["tensor"]},
                 lambda t: _waited(original(t["tensor"], a["op"], a["group"], a["async_op"])), a["group"],
                 {"reduce_op": _reduce_name(a["op"])})


def _broadcast(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    if not isinstance(a["tensor"], torch.Tensor) or not isinstance(a.get("src"), int):
        return None
    rest = {k: v for k, v in a.items() if k not in ("tensor",)}
    return _Call("broadcast", {}, {"tensor": a["tensor"]}, lambda t: _waited(original(t["tensor"], **rest)),
                 a["group"], {"src": a["src"]})


def _all_gather(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    outputs = _tensor_list("output", a["tensor_list"])
    if outputs is None or not isinstance(a["tensor"], torch.Tensor):
        return None
    return _Call("all_gather", {"input": a["tensor"]}, outputs,
                 lambda t: _waited(original([t[n] for n in outputs], t["input"], a["group"], a["async_op"])),
                 a["group"], {"dim": 0})


def _all_gather_into_tensor(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    if not isinstance(a["output_tensor"], torch.Tensor) or not isinstance(a["input_tensor"], torch.Tensor):
        return None
    return _Call("all_gather", {"input": a["input_tensor"]}, {"output": a["output_tensor"]},
                 lambda t: _waited(original(t["output"], t["input"], a["group"], a["async_op"])), a["group"],
                 {"dim": 0})


def _reduce_scatter(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    inputs = _tensor_list("input", a["input_list"])
    if inputs is None or not isinstance(a["output"], torch.Tensor):
        return None
    return _Call("reduce_scatter", inputs, {"output": a["output"]},
                 lambda t: _waited(original(t["output"], [t[n] for n in inputs], a["op"], a["group"], a["async_op"])),
                 a["group"], {"reduce_op": _reduce_name(a["op"]), "dim": 0})


def _reduce_scatter_tensor(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    if not isinstance(a["output"], torch.Tensor) or not isinstance(a["input"], torch.Tensor):
        return None
    return _Call("reduce_scatter", {"input": a["input"]}, {"output": a["output"]},
                 lambda t: _waited(original(t["output"], t["input"], a["op"], a["group"], a["async_op"])),
                 a["group"], {"reduce_op": _reduce_name(a["op"]), "dim": 0})


def _functional(original: Callable[..., Any], a: dict[str, Any], kind: str, first: str,
                extra: dict[str, Any]) -> _Call | None:
    if not isinstance(a[first], torch.Tensor):
        return None
    rest = {k: v for k, v in a.items() if k != first}

    def run(t: dict[str, torch.Tensor]) -> torch.Tensor:
        out = original(t["input"], **rest)
        return out.wait() if hasattr(out, "wait") else out  # an AsyncCollectiveTensor, made plain
    return _Call(kind, {"input": a[first]}, {}, run, a["group"], extra)


def _functional_all_reduce(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    return _functional(original, a, "all_reduce", "self", {"reduce_op": _reduce_name(a["reduceOp"])})


def _functional_all_gather(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    return _functional(original, a, "all_gather", "self", {"dim": a["gather_dim"]})


def _functional_reduce_scatter(original: Callable[..., Any], a: dict[str, Any]) -> _Call | None:
    return _functional(original, a, "reduce_scatter", "self",
                       {"reduce_op": _reduce_name(a["reduceOp"]), "dim": a["scatter_dim"]})
