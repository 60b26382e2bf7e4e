"""Looking inside a snapshot: which calls and tensors, their statistics, export as .npy.

The work behind `replay show`, kept apart from the command line so other tools and
tests can use it. Statistics are computed on the recorded view (not its storage
span); min, max and mean are over the finite elements, NaN and inf are counted.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import numpy as np
import torch

from replay.errors import ReplayError, SnapshotError
from replay.snapshot import CallEntry, CallRecord, Snapshot
from replay.snapshot.callfile import ROLES
from replay.snapshot.files import safe_component
from replay.snapshot.tensors import DTYPE_NAMES

# numpy has no bfloat16 or fp8: these are exported as float32, which holds them exactly.
EXPORT_AS_FLOAT32 = {dt for dt in (torch.bfloat16, getattr(torch, "float8_e4m3fn", None),
                                   getattr(torch, "float8_e5m2", None)) if dt is not None}


@dataclass(frozen=True)
class Selection:
    """Which calls and tensors to show: empty means all."""

    calls: tuple[int, ...] = ()
    ops: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()


@dataclass
class TensorSummary:
    role: str
    name: str
    dtype: str
    shape: list[int]
    stride: list[int]
    storage_offset: int
    blob: str | None
    numel: int
    min: float | int | None
    max: float | int | None
    mean: float | None
    nan: int
    inf: int
    exported: str | None = None
    exported_dtype: str | None = None
    chunked: bool = False  # stored in content-addressed pieces (format 2+)
    # an output buffer before its call: the elements the call overwrote, whose values were not
    # recorded (the statistics are of the others); None for every other tensor
    overwritten: int | None = None

    @property
    def by_content(self) -> bool:
        """Stored once by content, whatever calls hold it: a blob, or pieces."""
        return self.blob is not None or self.chunked


@dataclass
class CallSummary:
    """One call: its non-tensor `args` and `returns_json` as stored (JSON with the
    $float/$tuple wrappers of docs/FORMAT.md), and its selected tensors."""

    index: int
    op: str
    variant: str
    provider: str | None
    args: dict[str, Any]
    returns_json: dict[str, Any]
    launch: list[dict[str, Any]]
    tensors: list[TensorSummary] = field(default_factory=list)
    triton: dict[str, Any] | None = None  # a recorded Triton launch: grid, options, config


@dataclass
class SnapshotSummary:
    path: str
    manifest: dict[str, Any]
    calls_in_snapshot: int
    calls: list[CallSummary]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """numel, min, max, mean (finite elements only; None when there are none), nan and inf counts."""
    stats: dict[str, Any] = {"numel": t.numel(), "min": None, "max": None, "mean": None, "nan": 0, "inf": 0}
    if t.numel() == 0:
        return stats
    t, repeats = _one_copy(t)
    if t.dtype.is_floating_point:
        values = t.detach().to("cpu", torch.float64)  # exact for every float dtype we store
        stats["nan"] = int(values.isnan().sum()) * repeats
        stats["inf"] = int(values.isinf().sum()) * repeats
        finite = values[values.isfinite()]
        if finite.numel():
            stats.update(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()))
        return stats
    # Integers through numpy: exact min/max for every width, uint64 included.
    array = t.detach().cpu().contiguous().numpy()
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    stats.update(min=int(array.min()), max=int(array.max()), mean=float(array.mean(dtype=np.float64)))
    return stats


def _one_copy(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A broadcast view (stride 0) repeats the same elements evenly: one copy of them, and how
    many times the view holds it. min, max and mean are the copy's; counts scale."""
    repeats = 1
    for dim in range(t.dim()):
        if t.stride(dim) == 0 and t.shape[dim] > 1:
            repeats *= t.shape[dim]
            t = t.narrow(dim, 0, 1)
    return t, repeats


def selected_entries(snapshot: Snapshot, selection: Selection) -> list[CallEntry]:
    """The index entries chosen by `selection`; an unknown call index or op is an error."""
    entries = [snapshot.entry(i) for i in selection.calls] if selection.calls else list(snapshot.entries)
    if selection.ops:
        present = {e.op for e in snapshot.entries}
        missing = [o for o in selection.ops if o not in present]
        if missing:
            raise SnapshotError(f"{snapshot.path}: no calls of op {', '.join(map(repr, missing))} "
                                f"(ops present: {', '.join(sorted(present)) or 'none'})")
        entries = [e for e in entries if e.op in selection.ops]
    return entries


def selected_tensors(record: CallRecord, roles: tuple[str, ...]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(role, name, tensor) of a call, in recorded order, restricted to `roles` if given."""
    for key, tensor in record.tensors.items():
        role, _, name = key.partition("/")
        if not roles or role in roles:
            yield role, name, tensor


def export_tensor(tensor: torch.Tensor, path: Path) -> str:
    """Write the view as a .npy (no pickle); return the numpy dtype it was written as."""
    if tensor.dtype in EXPORT_AS_FLOAT32:
        tensor = tensor.to(torch.float32)
    array = tensor.detach().cpu().contiguous().numpy()
    try:
        np.save(path, array, allow_pickle=False)
    except OSError as exc:
        raise ReplayError(f"{path}: cannot export: {exc.strerror or exc}") from None
    return str(array.dtype)


def export_name(index: int, op: str, role: str, name: str) -> str:
    return f"{index:06d}-{safe_component(op)}-{role}-{safe_component(name)}.npy"


def summarise_call(record: CallRecord, roles: tuple[str, ...] = (), export_dir: Path | None = None) -> CallSummary:
    summary = CallSummary(record.index, record.op, record.variant, record.provider,
                          {a["name"]: a["json"] for a in record.args if "json" in a},
                          record.returns_json, record.launch, triton=record.triton)
    for role, name, tensor in selected_tensors(record, roles):
        key = f"{role}/{name}"
        overwritten = record.overwritten(key)
        stats = tensor_stats(tensor) if overwritten is None else {
            **tensor_stats(tensor[~overwritten]), "numel": tensor.numel()}  # the filler is no value
        row = TensorSummary(role, name, DTYPE_NAMES[tensor.dtype], list(tensor.shape), list(tensor.stride()),
                            # a SymInt (torch's stubs allow one) only under symbolic tracing: a snapshot's are real
                            record.recorded_offsets.get(key, cast(int, tensor.storage_offset())),
                            record.blobs.get(key), **stats, chunked=key in record.chunked,
                            overwritten=int(overwritten.sum()) if overwritten is not None else None)
        if export_dir is not None:
            target = export_dir / export_name(record.index, record.op, role, name)
            row.exported_dtype = export_tensor(tensor, target)
            row.exported = str(target)
        summary.tensors.append(row)
    return summary


def summarise(snapshot: Snapshot, selection: Selection = Selection(), export_dir: Path | None = None,
              progress: Callable[[int, int, CallEntry], None] | None = None) -> SnapshotSummary:
    """Summaries of the selected calls (loaded one at a time); with `export_dir`, export their tensors.

    `progress(done, total, entry)` is called after each call, for a progress display.
    """
    unknown = [r for r in selection.roles if r not in ROLES]
    if unknown:
        raise SnapshotError(f"unknown role(s) {unknown}; roles are {', '.join(ROLES)}")
    entries = selected_entries(snapshot, selection)
    if export_dir is not None:
        try:
            export_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReplayError(f"{export_dir}: cannot export there: {exc.strerror or exc}") from None
    calls = []
    for done, entry in enumerate(entries, start=1):
        calls.append(summarise_call(snapshot.load(entry), selection.roles, export_dir))
        if progress is not None:
            progress(done, len(entries), entry)
    return SnapshotSummary(str(snapshot.path), snapshot.manifest, len(snapshot), calls)


SHOWN_VALUES = 8  # values of an index tensor key_params shows
# positions, lengths and tables; not the bytes of quantised weights (uint8, int8)
INDEX_DTYPES = (torch.int16, torch.int32, torch.int64)


def key_params(arguments: dict[str, Any]) -> dict[str, Any]:
    """What explains a call without opening its tensors: scalar arguments as they are, index tensors
    (positions, position_buf, seq_len_buf, kv_cache_lengths, a block table) as their first values
    and, when longer, their length."""
    found: dict[str, Any] = {}
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            if value.dtype in INDEX_DTYPES:
                flat = value.reshape(-1)
                shown = flat[:SHOWN_VALUES].tolist()
                found[name] = shown if flat.numel() <= SHOWN_VALUES else {"first": shown, "of": flat.numel()}
        elif value is None or isinstance(value, (bool, int, float, str)):
            found[name] = value
    return found
