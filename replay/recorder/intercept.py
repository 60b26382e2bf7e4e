"""Interception: what a recorded function does when called, decided by one flag read.

`wrap(spec, fn)` returns a function with `fn`'s own parameters (compiled, so that nothing is packed
on the way) that calls `fn` while nothing intercepts calls, and otherwise routes the call to the
op's verifier (replay.verify) or to the active recording. A single-vector variant also checks that
it was handed one row (RowLimit). The route is set by replay/recorder/lifecycle.py (`route`); this
module calls nothing above it but the recording and verifier it was handed.
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from replay.recorder.staging import CallSpec

_intercepting = False  # a recording is active or an op is verified: captured calls take the slow path
_recording: Any = None  # the active recording (replay.capture.session.Recording), if any
# op name -> the verifier's hook for its calls (replay.verify): (spec, call, signature, args, kwargs) -> result
_verifiers: dict[str, Callable[..., Any]] = {}
# op name -> the policy of a verified op whose hook carries one (replay.verify), while nothing records:
# a compiled wrapper draws the call's number and compares it with `policy.until` itself, so that a
# call neither checked nor read by the gate runs no Python of the verifier's (_fast_path)
_replay_policies: dict[str, Any] = {}
_replay_is_compiling = torch.compiler.is_compiling  # traced by torch.compile: the hook decides there


def route(recording: Any, verifiers: dict[str, Callable[..., Any]]) -> None:
    """Where intercepted calls go from now on: the recording (or None) and each verified op's hook."""
    global _intercepting, _recording, _verifiers, _replay_policies
    if recording is not None:  # a call made meanwhile on another thread goes to the hook, as before
        _replay_policies = {}
        _recording, _verifiers = recording, dict(verifiers)
    else:
        _recording, _verifiers = None, dict(verifiers)
        _replay_policies = {op: policy for op, hook in verifiers.items()
                            if (policy := getattr(hook, "policy", None)) is not None}
    _intercepting = recording is not None or bool(verifiers)


def _replay_pack(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """A compiled wrapper's arguments as the hooks take them (its slow path alone packs them)."""
    return args, kwargs


@dataclass(frozen=True)
class RowLimit:
    """A single-vector variant's guard: it is handed one row. Its rows are counted as Op.rows counts
    them: along the axis of the first of its batch-axis parameters (`axes`, in the op's order)
    given a tensor that has that axis."""

    op: str
    axes: tuple[tuple[str, int], ...]

    def check(self, *values: Any) -> None:
        """Refuse the call if the values of the batch-axis parameters, in order, hold other than one row."""
        for value, (_, axis) in zip(values, self.axes):
            if isinstance(value, torch.Tensor) and value.dim() > axis:
                if value.shape[axis] != 1:
                    raise ValueError(f"{self.op} single: takes one row, got {value.shape[axis]}; use the batched "
                                     "variant")
                return


def wrap(spec: CallSpec, fn: Callable, row_limit: RowLimit | None = None) -> Callable:
    """Wrap `fn` so calls are recorded while a recording is active (and verified while its op is),
    and, with `row_limit`, refused when they pass more than one row.

    With neither the wrapper costs one global read and a call (and the row check, one shape
    read): it is compiled with `fn`'s own parameters, so that nothing is packed into *args and
    **kwargs on the way."""
    signature = inspect.signature(fn)

    def run(*args: Any, **kwargs: Any) -> Any:
        rec = _recording  # read again: another thread may have stopped the recording meanwhile
        if rec is None:
            return fn(*args, **kwargs)
        return rec.record(spec, fn, signature, args, kwargs)

    checked = spec.variant != "reference"  # a reference is what a verified call is checked against

    def record(*args: Any, **kwargs: Any) -> Any:
        verifier = _verifiers.get(spec.op)
        if verifier is not None and checked:
            # the function itself where nothing records: a frame less on every verified call
            return verifier(spec, run if _recording is not None else fn, signature, args, kwargs)
        return run(*args, **kwargs)

    # Any: a function that carries its spec as an attribute
    captured: Any = functools.wraps(fn)(_fast_path(fn, signature, record, row_limit, spec if checked else None)
                                        or _limited(record, signature, row_limit))
    captured.__replay_spec__ = spec
    return captured


def _limited(record: Callable, signature: inspect.Signature, row_limit: RowLimit | None) -> Callable:
    """`record` with the row check done on its bound arguments, where no wrapper could be compiled."""
    if row_limit is None:
        return record

    def limited(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:  # the call itself is wrong: let the function raise its own error
            return record(*args, **kwargs)
        row_limit.check(*(bound.get(name) for name, _ in row_limit.axes))
        return record(*args, **kwargs)
    return limited


_FAST_PREFIX = "_replay_"
_replay_Tensor = torch.Tensor  # what a compiled row check tests against (read from this module's globals)


def _fast_path(fn: Callable, signature: inspect.Signature, record: Callable,
               row_limit: RowLimit | None = None, verified: CallSpec | None = None) -> Callable | None:
    """A function with `fn`'s parameters that calls `fn` while nothing intercepts calls and
    `record` otherwise, checking `row_limit` first (inline: a shape read); with `verified` (the
    spec of a variant the verifier checks), a call of a verified op whose number is before its
    policy's `until` calls `fn` too, and a later one resumes the verifier's hook with that number.
    None where the parameters cannot be written out again, or may not be what `fn` takes (a
    decorated function: its signature is its wrapped one's; a partial; an object)."""
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__"):
        return None
    params: list[str] = []  # written out in the compiled wrapper's signature
    passed: list[str] = []  # in its call of `fn`
    defaults: dict[str, Any] = {}
    kinds = inspect.Parameter
    for i, p in enumerate(signature.parameters.values()):
        if p.name.startswith(_FAST_PREFIX) or p.name == "_intercepting" or not p.name.isidentifier():
            return None  # the names the compiled wrapper reads itself
        # keyed by any kind: inferred, the keys would be these two kinds only, and p.kind no key
        starred: dict[inspect._ParameterKind, str] = {kinds.VAR_POSITIONAL: f"*{p.name}",
                                                      kinds.VAR_KEYWORD: f"**{p.name}"}
        text = starred.get(p.kind, p.name)
        if p.default is not p.empty:
            defaults[f"{_FAST_PREFIX}d{i}"] = p.default
            text += f"={_FAST_PREFIX}d{i}"
        if p.kind == kinds.KEYWORD_ONLY and not any(q.startswith("*") for q in params):
            params.append("*")
        params.append(text)
        if p.kind == kinds.POSITIONAL_ONLY and (i + 1 == len(signature.parameters) or
                                                list(signature.parameters.values())[i + 1].kind != p.kind):
            params.append("/")
        passed.append({**starred, kinds.KEYWORD_ONLY: f"{p.name}={p.name}"}.get(p.kind, p.name))
    arguments, call = ", ".join(params), ", ".join(passed)
    factory = ", ".join([f"{_FAST_PREFIX}fn", f"{_FAST_PREFIX}record", f"{_FAST_PREFIX}limit", f"{_FAST_PREFIX}spec",
                         f"{_FAST_PREFIX}signature", *defaults])
    guard = ""
    if row_limit is not None:
        if not row_limit.axes or any(name not in signature.parameters for name, _ in row_limit.axes):
            return None
        (first, axis), names = row_limit.axes[0], ", ".join(name for name, _ in row_limit.axes)
        # one row in the first: the common case, read inline; anything else is worked out by check()
        guard = (f"        if not (isinstance({first}, {_FAST_PREFIX}Tensor) and {first}.dim() > {axis} "
                 f"and {first}.shape[{axis}] == 1):\n"
                 f"            {_FAST_PREFIX}limit.check({names})\n")
    unchecked = ""
    if verified is not None:  # the verifier's common case, inline: no frame, no packing (route)
        pre = _FAST_PREFIX
        unchecked = (f"        {pre}policy = {pre}policies.get({verified.op!r})\n"
                     f"        if {pre}policy is not None and not {pre}is_compiling():\n"
                     f"            {pre}number = next({pre}policy.numbers)\n"
                     f"            if {pre}number < {pre}policy.until:\n"
                     f"                return {pre}fn({call})\n"
                     f"            return {pre}policy.resume({pre}number, {pre}spec, {pre}fn, {pre}signature, "
                     f"*{pre}pack({call}))\n")
    source = (f"def {_FAST_PREFIX}make({factory}):\n"
              f"    def captured({arguments}):\n"
              f"{guard}"
              f"        if not _intercepting:\n"
              f"            return {_FAST_PREFIX}fn({call})\n"
              f"{unchecked}"
              f"        return {_FAST_PREFIX}record({call})\n"
              f"    return captured\n")
    made: dict[str, Any] = {}
    # reads _intercepting and _replay_policies live
    exec(compile(source, f"<replay capture of {fn.__qualname__}>", "exec"), globals(), made)
    captured = made[f"{_FAST_PREFIX}make"](fn, record, row_limit, verified, signature, *defaults.values())
    # a wrong call's TypeError names the function, as the function itself would (co_qualname: 3.11 on)
    renamed = {"co_name": fn.__name__, **({"co_qualname": fn.__qualname__} if sys.version_info >= (3, 11) else {})}
    captured.__code__ = captured.__code__.replace(**renamed)
    return captured
