"""What a running call reports besides its result: its tags, the launches it made, the scope it runs in.

A kernel calls `replay.tag(...)` and `replay.record_launch(...)` wherever it runs; what collects
them is a CallSink set for the call by whoever runs it (a recording, a replay, `replay ptx`,
`replay invariance`, the verifier): `collecting(...)`. With none set, both cost one context
variable read. `replay.scope(...)` labels the calls made inside a block. Nothing here records
anything: the recording machinery (replay/recorder/) is one user of it among others.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch

from replay.snapshot import jsonargs
from replay.snapshot.schema import check_name

_sink: contextvars.ContextVar["CallSink | None"] = contextvars.ContextVar("replay_sink", default=None)
_scope: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar("replay_scope", default=())


@dataclass
class CallSink:
    """Collects the tags and launch records of one running call."""

    level: int
    arguments: Mapping[str, Any] = field(default_factory=dict)  # the call's, to name what a kernel is handed
    tags: dict[str, torch.Tensor] = field(default_factory=dict)
    launches: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # tags that were not tensors, described
    # a tag keeps its value at the tag: copied then, unless whoever takes the tags copies them later
    # with what the call wrote (a CUDA graph's staging: a copy at the tag would be a node of its own);
    # a tag of memory the call declares it writes (`written`: storage addresses) is copied anyway
    copy_tags: bool = True
    written: frozenset[int] = frozenset()
    _versions: dict[str, int] = field(default_factory=dict)  # of tags not copied

    def argument_holding(self, pointer: torch.Tensor) -> str | None:
        """The call argument a kernel's tensor argument is, or is a view into: the same address
        first, else the argument whose storage holds it."""
        tensors = [(n, t) for n, t in self.arguments.items() if isinstance(t, torch.Tensor)]
        for name, tensor in tensors:
            if tensor.data_ptr() == pointer.data_ptr() and tensor.device == pointer.device:
                return name
        address = pointer.data_ptr()
        for name, tensor in tensors:
            storage = tensor.untyped_storage()
            if tensor.device == pointer.device and storage.data_ptr() <= address < storage.data_ptr() + storage.nbytes():
                return name
        return None

    def add_tag(self, name: str, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):  # a recording reports it; a replay skips it
            self.rejected.append(f"tag '{name}' is a value of type {type(tensor).__name__}, not a tensor")
            return
        try:
            check_name(name, "tag")
        except ValueError as exc:  # no text: a snapshot could not hold it
            self.rejected.append(str(exc))
            return
        key, n = name, 1
        while key in self.tags:
            key, n = f"{name}.{n}", n + 1
        tensor = tensor.detach()
        if self.copy_tags or tensor.is_inference() or tensor.untyped_storage().data_ptr() in self.written:
            tensor = tensor.clone()
        else:
            self._versions[key] = tensor._version
        self.tags[key] = tensor

    def tags_moved(self) -> list[str]:
        """Tags not copied that a write through torch changed since they were taken."""
        return [key for key, version in self._versions.items() if self.tags[key]._version != version]


@contextlib.contextmanager
def collecting(level: int = 2, arguments: Mapping[str, Any] | None = None, copy_tags: bool = True,
               written: frozenset[int] = frozenset()) -> Iterator[CallSink]:
    """Collect tags (up to `level`) and launch records of the code run inside; `arguments`, the
    call's, name the tensors its kernels are handed (a launch record's `binds`)."""
    sink = CallSink(level, dict(arguments or {}), copy_tags=copy_tags, written=written)
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)


def tag(name: str, tensor: torch.Tensor, level: int = 1) -> torch.Tensor:
    """Record an intermediate of the running call under `name`, for replay to compare.

    Replay compares tags in the order they were recorded and names the first that
    diverges, so tag what explains a wrong output (positions written, rstd, lse). With
    no recording or replay running this is one context-variable read.

    Args:
        name: the tag's name; a repeated name within one call gets `.1`, `.2`, ...
        tensor: the value (copied now; later writes to it do not change the tag). Inside a
            CUDA graph capture the copy is put off to the end of the call, as the outputs' are:
            a later write through torch in the same call is reported, one by a kernel to memory
            the call does not declare it writes is not seen. Anything but a tensor is a capture
            error: that call is not recorded (replay skips it).
        level: 1 (recorded by default) or 2 (only with REPLAY_TAGS=2: costly or verbose).

    Returns:
        `tensor` itself, so a tag can wrap an expression.

    Example:
        rstd = replay.tag("rstd", 1.0 / torch.sqrt(ms + eps))
    """
    sink = _sink.get()
    if sink is not None and level <= sink.level:
        sink.add_tag(name, tensor)
    return tensor


@contextlib.contextmanager
def scope(name: str, value: int | float | str | bool) -> Iterator[None]:
    """Label the calls made inside the block: each recorded call keeps the labels of the scopes
    around it (`{"step": 2, "layer": 3}`), which `replay trace` draws as nested slices and
    `replay kv-check` uses to find a layer's cache. Costs one context-variable set with no
    recording active.

    Args:
        name: what is being labelled: "step" and "layer" are drawn as the timeline's levels,
            "run" separates the runs `replay kv-check SNAPSHOT` compares; any other is kept as is.
        value: its value (a number or a short string).

    Example:
        for i, layer in enumerate(layers):
            with replay.scope("layer", i):
                h = layer(h)
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"replay.scope: the name must be a non-empty string, got {name!r}")
    if not isinstance(value, (int, float, str, bool)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"replay.scope({name!r}): the value must be a finite number or a string, got {value!r}")
    token = _scope.set((*_scope.get(), (name, value)))
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> dict[str, Any]:
    """The labels of the scopes around the running code, outermost first."""
    return dict(_scope.get())


_recorder_busy: contextvars.ContextVar[bool] = contextvars.ContextVar("replay_recorder_busy", default=False)


@contextlib.contextmanager
def recorder_work() -> Iterator[None]:
    """Mark the block as the recorder's own work (its copies, an autotuner's timing runs, a launch
    it lets pass): the PyTorch operators it runs are not the program's calls (--torch-ops)."""
    token = _recorder_busy.set(True)
    try:
        yield
    finally:
        _recorder_busy.reset(token)


def recorder_busy() -> bool:
    return _recorder_busy.get()


_recorder_kernel: contextvars.ContextVar[bool] = contextvars.ContextVar("replay_recorder_kernel", default=False)


@contextlib.contextmanager
def recorder_kernel() -> Iterator[None]:
    """Mark the block as launching the recorder's own Triton kernels (its checksums): their
    launches and operators are no calls of the program, whatever else records."""
    token = _recorder_kernel.set(True)
    try:
        with recorder_work():
            yield
    finally:
        _recorder_kernel.reset(token)


def recorder_kernel_running() -> bool:
    return _recorder_kernel.get()


_steps = itertools.count(1)
_step = 0  # the program's step now: 0 before its first replay.step()


def step() -> int:
    """Mark the start of the program's next step (a training step, a decode step) and return its
    number, from 1. A recording made with `--steps A:B` (`steps=(A, B)`) keeps the unregistered
    calls (Triton launches, torch ops) of steps A to B-1 only; calls before the first mark are
    step 0. Costs a counter's step with no recording active.

    Example:
        for batch in loader:
            replay.step()
            train_step(batch)
    """
    global _step
    _step = next(_steps)
    return _step


def current_step() -> int:
    return _step


def launches_wanted() -> bool:
    """Whether a call is being recorded or replayed now, so that launch records are kept (a kernel
    library may skip working out what it would record otherwise)."""
    return _sink.get() is not None


def record_launch(kernel: str, grid: Any = None, *, compiled: Any = None,
                  pointers: Mapping[str, torch.Tensor] | None = None, **info: Any) -> None:
    """Record a kernel launch into the running call's launch records (a no-op outside one).

    Args:
        kernel: the kernel's name.
        grid: the launch grid (any sequence of ints).
        compiled: the object a Triton launch returns; its warps, stages, shared memory,
            registers and hash (of the compiled kernel) are recorded when the backend reports
            them (a GPU does; the interpreter does not).
        pointers: the kernel's tensor arguments by its parameter names; recorded as `binds`,
            parameter -> the call's argument it points into (`src_pos_ptr` -> `position_buf`).
        **info: anything else worth keeping, JSON or kept as its repr: block sizes,
            `path="indirect"` for which of two code paths ran.

    Returns:
        None.

    Example:
        compiled = kernel[grid](x, out, n, BLOCK=block)
        replay.record_launch("rmsnorm_kernel", grid, compiled=compiled, BLOCK=block, path="direct")
    """
    sink = _sink.get()
    if sink is None:
        return
    entry: dict[str, Any] = {"kernel": kernel, "grid": list(grid) if grid is not None else None,
                             **compiled_details(compiled)}
    try:
        binds = {param: sink.argument_holding(tensor) for param, tensor in (pointers or {}).items()
                 if isinstance(tensor, torch.Tensor)}
    except RuntimeError:  # a tensor without storage (sparse, meta): informational, never fatal
        binds = {}
    if any(binds.values()):
        entry["binds"] = {param: name for param, name in binds.items() if name is not None}
    entry.update(info)
    sink.launches.append({key: _json_or_repr(value) for key, value in entry.items()})


def compiled_details(compiled: Any) -> dict[str, Any]:
    """What the object a Triton launch returns says of the compiled kernel: warps, stages, shared
    memory, hash and registers, where the backend reports them (a GPU does; the interpreter, nothing),
    as JSON. Read once a kernel once it is loaded (its registers counted): a recording asks at
    every launch."""
    if compiled is None:
        return {}
    known = _COMPILED_DETAILS.get(id(compiled))
    if known is not None and known[0] is compiled:
        return dict(known[1])
    details = _read_compiled_details(compiled)
    if "registers" in details:  # loaded (its registers are counted then): what it says stays true
        if len(_COMPILED_DETAILS) >= _COMPILED_KEPT:
            _COMPILED_DETAILS.clear()
        _COMPILED_DETAILS[id(compiled)] = (compiled, details)  # held: its id names no other kernel meanwhile
    return dict(details)


_COMPILED_KEPT = 4096  # kernels whose details are kept; past it they are read again
_COMPILED_DETAILS: dict[int, tuple[Any, dict[str, Any]]] = {}


def _read_compiled_details(compiled: Any) -> dict[str, Any]:
    details: dict[str, Any] = {}
    meta = getattr(compiled, "metadata", None)
    for attr in ("num_warps", "num_stages", "shared", "hash"):
        if meta is not None and hasattr(meta, attr):
            details[attr] = _json_or_repr(getattr(meta, attr))
    if getattr(compiled, "n_regs", None) is not None:
        details["registers"] = _json_or_repr(compiled.n_regs)
    return details


def _json_or_repr(value: Any) -> Any:
    """Launch details are informational: keep what JSON cannot hold as its repr."""
    try:
        return jsonargs.encode(value)
    except jsonargs.NotJSONRepresentable:
        try:
            return repr(value)
        except Exception:  # a failing __repr__, an int too long to print: never crash the program
            return f"<{type(value).__name__}>"


def returned_values(result: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    values = result if isinstance(result, (tuple, list)) else (result,)
    default = ("out",) if len(values) == 1 else tuple(f"out{i}" for i in range(len(values)))
    chosen = names if len(names) == len(values) else default
    return dict(zip(chosen, values))


