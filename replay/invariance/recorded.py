"""Batch invariance of recorded calls: each call's recorded arguments are the rows."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from replay.engine.runner import fresh_copy
from replay.errors import ReplayError
from replay.invariance.properties import InvarianceReport, Plan, check_rows
from replay.code import KernelCode
from replay.registry import get_op
from replay.snapshot import Snapshot


def check_snapshot(path: Path, plan: Plan, device: str, ops: Iterable[str] = (), calls: Iterable[int] = (),
                   variant: str | None = None, providers: Iterable[str] = (),
                   code_dir: Path | None = None) -> list[InvarianceReport]:
    """Each chosen call of the snapshot at `path`, its `variant` (default: the recorded one) run on
    its recorded rows; the ops' providers must be trusted."""
    snapshot, code = Snapshot(path), KernelCode(code_dir, providers)
    wanted_ops, wanted_calls = set(ops), set(calls)
    reports = []
    for entry in snapshot.entries:
        if (wanted_ops and entry.op not in wanted_ops) or (wanted_calls and entry.index not in wanted_calls):
            continue
        record = snapshot.load(entry)
        if record.provider is not None:
            code.import_provider(record.provider, f"{path}: call {entry.index}")
        op = get_op(entry.op)
        pool = {name: fresh_copy(value, device) for name, value in record.arguments().items()}
        try:
            reports.append(check_rows(op, variant or entry.variant, f"call {entry.index}", pool, pool, plan, device))
        except ReplayError:
            raise
        except Exception as exc:  # recorded rows the variant cannot take: said of that call, in one line
            raise ReplayError(f"{path}: call {entry.index} ({entry.op} {variant or entry.variant}) failed on its "
                              f"recorded rows: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    return reports
