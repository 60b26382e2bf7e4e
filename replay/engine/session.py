"""Replaying a whole snapshot: load each call lazily, run its variants, collect checks."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from replay.engine import checks
from replay.engine.provenance import golden_warning
from replay.engine.report import CallReport, CheckKind, RunReport
from replay.engine.runner import VariantRun, run_variant
from replay.errors import RegistryError, SnapshotError
from replay.registry import REFERENCE, Op, get_op, load_provider
from replay.snapshot import CallRecord, Snapshot
from replay.tolerance import Tolerance
from replay.trust import ProviderTrust


@dataclass
class ReplayOptions:
    device: str = "cpu"
    code_dir: Path | None = None
    ops: frozenset[str] | None = None
    calls: frozenset[int] | None = None
    variants: frozenset[str] | None = None
    golden: bool = False
    golden_dir: Path | None = None
    atol: float | None = None
    rtol: float | None = None
    repeat: int = 1
    fail_fast: bool = False
    tag_level: int = 2
    providers: frozenset[str] = frozenset()  # modules the user trusts beyond the declared ones

    @property
    def explicit_tolerance(self) -> Tolerance | None:
        if self.atol is None and self.rtol is None:
            return None
        return Tolerance(self.atol or 0.0, self.rtol or 0.0)


ProgressFn = Callable[[int, int, CallReport], None]


class _Providers:
    """Imports each trusted provider module once (from --code first, when given)."""

    def __init__(self, code_dir: Path | None, trusted: Iterable[str]):
        self.code_dir = code_dir
        self.trust = ProviderTrust.of(trusted, code_dir)
        self.loaded: set[str] = set()

    def code_paths(self) -> list[Path]:
        """Where the providers' code is: a top-level package's directory, or a loose module's file."""
        found = []
        for provider in self.loaded:
            module = sys.modules.get(provider.split(".")[0])
            origin = Path(getattr(module, "__file__", None) or "")
            if origin.name:
                found.append(origin.resolve().parent if origin.name == "__init__.py" else origin.resolve())
        return found

    def op_for(self, record: CallRecord, snapshot: Path) -> Op:
        if record.provider and record.provider not in self.loaded:
            self.trust.check(record.provider, f"{snapshot}: call {record.index}")
            load_provider(record.provider, self.code_dir)
            self.loaded.add(record.provider)
        try:
            return get_op(record.op)
        except RegistryError as exc:
            where = f"provider '{record.provider}'" if record.provider else "no provider recorded"
            raise RegistryError(f"{snapshot}: call {record.index}: {exc} ({where})") from None


def _variants_to_run(op: Op, recorded_variant: str | None, options: ReplayOptions) -> list[str]:
    backend = options.device
    if options.variants:
        wanted = list(options.variants)
    elif options.golden and recorded_variant:
        wanted = [recorded_variant]
    else:
        wanted = list(op.variants)
    for name in wanted:
        op.get(name, backend)  # raises a clear RegistryError for a missing variant or backend
    if not options.golden and REFERENCE in op.variants and REFERENCE not in wanted:
        wanted.append(REFERENCE)
    return [n for n in wanted if backend in op.variants[n].backends]


def check_arguments(op: Op, inputs: dict[str, Any], options: ReplayOptions,
                    recorded: CallRecord | None = None, golden: CallRecord | None = None) -> CallReport:
    """Run the chosen variants of `op` on `inputs` and check them against each other,
    the reference and the contracts; with `recorded`, against that recording too
    (its outputs, or in golden mode those of `golden` when given, as the oracle).
    """
    if options.golden and recorded is None:
        raise ValueError("golden mode needs the recorded call")
    report = CallReport(recorded.index if recorded else -1, op.name, recorded.variant if recorded else "-")
    runs: dict[str, VariantRun] = {}
    for name in _variants_to_run(op, recorded.variant if recorded else None, options):
        runs[name] = run_variant(op, op.variants[name], inputs, options.device, options.tag_level)
        report.variant_seconds[name] = runs[name].seconds
        if runs[name].untestable:
            report.untestable = f"{name}: {runs[name].error}"
        for attempt in range(2, options.repeat + 1):
            again = run_variant(op, op.variants[name], inputs, options.device, options.tag_level)
            report.checks += checks.repeat_checks(runs[name], again, attempt)
    report.checks += checks.error_checks(runs.values())
    recorded_tags = recorded.role("tag") if recorded else {}
    if recorded:
        report.checks += checks.contract_checks(op, inputs, recorded.role("out"), recorded_tags,
                                                f"{recorded.variant} (recorded)")
    for run in runs.values():
        if not run.error:
            report.checks += checks.contract_checks(op, inputs, run.outputs, run.tags, run.variant)
    if options.golden:
        oracle = golden or recorded
        against = "golden" if golden else "recorded"
        tol = checks.fixed(options.explicit_tolerance)
        for run in runs.values():
            if run.error:
                continue
            report.checks += checks.against_outputs(op, run, oracle.role("out"), CheckKind.VS_GOLDEN, against, tol)
            oracle_tags = oracle.role("tag")
            report.checks += checks.tag_checks(op, run, oracle_tags, list(oracle_tags), against, tol)
        return report
    report.checks += checks.single_vs_batched(op, runs)
    report.checks += checks.reference_checks(op, runs, list(recorded_tags))
    report.checks += checks.single_vs_batched_tags(op, runs, list(recorded_tags))
    replayed = runs.get(recorded.variant) if recorded else None
    if replayed is not None and not replayed.error:
        report.checks += checks.against_outputs(op, replayed, recorded.role("out"), CheckKind.VS_RECORDED, "recorded",
                                                op.tolerance_for)
    return report


def replay_call(op: Op, record: CallRecord, golden: CallRecord | None, options: ReplayOptions) -> CallReport:
    """Run the chosen variants of one recorded call and check them."""
    return check_arguments(op, record.arguments(), options, record, golden)


def replay_snapshot(path: str | Path, options: ReplayOptions, progress: ProgressFn | None = None) -> RunReport:
    """Replay every selected call of the snapshot at `path`, one call in memory at a time."""
    started = time.perf_counter()
    snapshot = Snapshot(path)
    golden_snapshot = Snapshot(options.golden_dir) if options.golden_dir else None
    mode = "golden" if options.golden else "variants"
    report = RunReport(str(path), options.device, mode)
    entries = [e for e in snapshot.entries
               if (options.ops is None or e.op in options.ops)
               and (options.calls is None or e.index in options.calls)]
    if not entries:
        raise SnapshotError(f"{path}: no calls match the filters ({len(snapshot)} calls recorded)")
    providers = _Providers(options.code_dir, options.providers)
    for done, entry in enumerate(entries, start=1):
        load_started = time.perf_counter()
        record = snapshot.load(entry)
        golden = _golden_record(golden_snapshot, entry.index, record) if golden_snapshot else None
        load_seconds = time.perf_counter() - load_started
        op = providers.op_for(record, snapshot.path)
        call_report = replay_call(op, record, golden, options)
        call_report.load_seconds = load_seconds
        report.load_seconds += load_seconds
        report.calls.append(call_report)
        if progress:
            progress(done, len(entries), call_report)
        if call_report.untestable or (options.fail_fast and not call_report.passed):
            break
    if options.golden:
        warning = golden_warning(golden_snapshot.manifest if golden_snapshot else snapshot.manifest,
                                 options.device, providers.code_paths(), options.explicit_tolerance is not None)
        report.warnings += [warning] if warning else []
    report.total_seconds = time.perf_counter() - started
    return report


def _golden_record(golden: Snapshot, index: int, record: CallRecord) -> CallRecord:
    other = golden.load(index)
    if other.op != record.op:
        raise SnapshotError(f"{golden.path}: call {index} is op '{other.op}', "
                            f"but the replayed snapshot's call {index} is '{record.op}'")
    return other
