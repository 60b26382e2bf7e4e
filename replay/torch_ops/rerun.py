"""A recorded PyTorch operator call as an op the replay engine runs.

The operator is found by its overload name (`torch.ops.aten.add.Tensor`); nothing the snapshot
names is imported but a custom op's defining module, under the provider trust rule. Variant
"torch" runs it again on fresh copies of the recorded arguments (held to the recorded outputs
bit for bit, unless a tolerance is given); the reference runs it on float64 copies on the CPU
(held to the op's default tolerance for the dtype), so a kernel behind an operator that is wrong
on one device, or in low precision, is named by call, op and rows.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from replay.code import KernelCode
from replay.errors import SnapshotError
from replay.registry import REFERENCE, Op
from replay.snapshot import CallRecord
from replay.tolerance import EXACT, Tolerance
from replay.torch_ops.recording import VARIANT
from replay.torch_ops.schema import expanded, joined, schema_of, typed
from replay.triton_launches.relaunch import KernelNotFound


def op_for(code: KernelCode, record: CallRecord, where: str, tolerance: Tolerance | None = None) -> Op:
    """The op that reruns `record` (a call with a `torch_op` field): KernelNotFound when this torch
    has no such operator (or the custom op's library was not loaded)."""
    if record.provider:
        code.import_provider(record.provider, where)
    func = _overload(record.op)
    if func is None:
        hint = "" if record.op.startswith("aten.") else "; load the library that defines it with --provider MOD"
        raise KernelNotFound(f"op {record.op}: no such operator in torch {torch.__version__}{hint}")
    described = record.torch_op or {}
    kinds, lists = dict(described.get("typed", {})), dict(described.get("lists", {}))
    recorded = record.arguments()
    try:  # made once here, so that a name that makes nothing is bad input, not a divergence
        typed({name: recorded[name] for name in kinds if name in recorded}, kinds)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    schema = schema_of(func)
    written = expanded(schema.mutates, lists)
    mutated = tuple(n for n in record.role("out") if n in written)
    outputs = tuple(n for n in record.role("out") if n not in mutated)
    op = Op(record.op, record.provider or "", mutates=mutated, outputs=outputs,
            batch_axes={name: 0 for name in record.role("out")},
            tolerance={}, rerun_tolerance=tolerance or EXACT)
    run = _runner(func, schema.returns_alias, kinds, lists)
    op.variant(VARIANT)(run)
    op.variant(REFERENCE)(_in_float64(run, mutated))
    return op


def _overload(name: str) -> Any:
    namespace, _, rest = name.partition(".")
    operator, _, overload = rest.rpartition(".")
    found = getattr(torch.ops, namespace, None)
    for part in (operator, overload):
        try:
            found = getattr(found, part, None) if found is not None and part else None
        except (AttributeError, RuntimeError):  # torch.ops raises its own for a name it has not
            return None
    return found if isinstance(found, torch._ops.OpOverload) else None


def _runner(func: Any, returns_alias: bool, kinds: dict[str, str], lists: dict[str, int]) -> Callable[..., Any]:
    def run(**given: Any) -> Any:
        result = func(**typed(joined(given, lists), kinds))
        return None if returns_alias else result  # an in-place op's result is what it wrote
    return run


def _in_float64(run: Callable[..., Any], mutated: tuple[str, ...]) -> Callable[..., Any]:
    """`run` on float64 CPU copies of the floating-point tensors; what it writes into the mutated
    arguments is copied back into them, what it returns stays float64 (the reference check
    compares across dtypes, within the tolerance of the variant's)."""
    def reference(**given: Any) -> Any:
        wide = {name: _widened(value) for name, value in given.items()}
        result = run(**wide)
        for name in mutated:
            if given[name].shape != wide[name].shape:  # an out= buffer the operator resized
                given[name].resize_(wide[name].shape)
            given[name].copy_(wide[name])
        return result
    return reference


def _widened(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to("cpu", torch.float64)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return value
