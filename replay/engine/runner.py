"""Running one variant of an op on recorded arguments.

Each run gets fresh copies of the tensor arguments (same strides, same storage
offset) on the target device, so in-place variants never disturb each other or the
recording. `single` runs row by row: independently, or in order through shared
state for ops whose rows are serial (a KV cache filled token by token).
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from replay.context import CallSink, collecting, returned_values
from replay.registry import SINGLE, Op, Variant
from replay.snapshot.tensors import geometry_of


@dataclass
class VariantRun:
    """What one variant produced: outputs (returned and mutated), tags, launches."""

    variant: str
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    tags: dict[str, torch.Tensor] = field(default_factory=dict)
    launches: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    untestable: bool = False


def fresh_copy(value: Any, device: str) -> Any:
    """A copy of a tensor on `device` with the same strides and storage offset."""
    if not isinstance(value, torch.Tensor):
        return value
    extent = value.storage_offset() + geometry_of(value).span
    base = torch.as_strided(value, (extent,), (1,), 0).to(device, copy=True)
    return torch.as_strided(base, tuple(value.shape), value.stride(), value.storage_offset())


def _named_outputs(op: Op, result: Any, args: dict[str, Any]) -> dict[str, torch.Tensor]:
    outputs = returned_values(result, op.outputs)
    outputs.update({name: args[name] for name in op.mutates if isinstance(args.get(name), torch.Tensor)})
    return {name: value for name, value in outputs.items() if isinstance(value, torch.Tensor)}


def _is_build_failure(exc: Exception) -> bool:
    return type(exc).__name__ in {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources"}


def _invoke(variant: Variant, args: dict[str, Any], tag_level: int) -> tuple[Any, CallSink]:
    with collecting(tag_level, args) as sink:
        result = variant.fn(**args)
    return result, sink


def signature_mismatch(fn: Any, arguments: dict[str, Any]) -> str | None:
    """Why `fn` cannot take `arguments` by name (a parameter renamed, added or removed since they
    were recorded), or None when it can or its signature cannot be read."""
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as exc:
        return str(exc)
    except ValueError:  # a builtin without a signature: let the call say it
        pass
    return None


def run_variant(op: Op, variant: Variant, recorded_args: dict[str, Any], device: str,
                tag_level: int = 2) -> VariantRun:
    """Run `variant` on copies of `recorded_args`; failures are kept, not raised. A variant that no
    longer takes the recorded arguments is untestable, not wrong: the call cannot be made."""
    run = VariantRun(variant.name)
    mismatch = signature_mismatch(variant.fn, recorded_args)
    if mismatch is not None:
        run.error = f"{getattr(variant.fn, '__qualname__', variant.name)} no longer takes the recorded arguments: {mismatch}"
        run.untestable = True
        return run
    args = {name: fresh_copy(value, device) for name, value in recorded_args.items()}
    rows = op.rows(args) if variant.name == SINGLE else None
    started = time.perf_counter()
    try:
        if rows is None:
            result, sink = _invoke(variant, args, tag_level)
            run.outputs = _named_outputs(op, result, args)
            run.tags, run.launches = sink.tags, sink.launches
        else:
            _run_rows(op, variant, args, rows, tag_level, run)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the code under test may fail in any way; report it
        run.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        run.untestable = _is_build_failure(exc)
    run.seconds = time.perf_counter() - started
    return run


def _run_rows(op: Op, variant: Variant, args: dict[str, Any], rows: int, tag_level: int,
              run: VariantRun) -> None:
    """Single-row calls, stitched back together along each output's batch axis."""
    per_row_outputs: list[dict[str, torch.Tensor]] = []
    per_row_tags: list[dict[str, torch.Tensor]] = []
    for row in range(rows):
        # Serial ops share the mutable state across rows; independent rows start fresh.
        row_args = op.row_arguments(args, row)
        result, sink = _invoke(variant, row_args, tag_level)
        per_row_outputs.append(_named_outputs(op, result, row_args))
        per_row_tags.append(sink.tags)
        run.launches.extend(sink.launches)
    run.outputs = _stitch(op, per_row_outputs, args)
    run.tags = _stitch(op, per_row_tags, {})


def _stitch(op: Op, per_row: list[dict[str, torch.Tensor]], args: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Concatenate rows of batch-axis values; mutated arguments are taken as the rows left them."""
    stitched: dict[str, torch.Tensor] = {}
    for name in per_row[0] if per_row else ():
        if name in op.mutates:
            stitched[name] = args[name]
        elif name in op.batch_axes and all(name in r for r in per_row):
            stitched[name] = torch.cat([r[name] for r in per_row], dim=op.batch_axes[name])
    return stitched
