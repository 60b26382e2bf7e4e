"""Replaying a whole snapshot: load each call lazily, run its variants, collect checks."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from replay.compare import bit_pattern
from replay.engine import checks, declared
from replay.engine.provenance import golden_warning
from replay.engine import evidence
from replay.engine.evidence import Evidence
from replay.engine.report import CallReport, CheckKind, RunReport
from replay.engine.runner import VariantRun, run_variant
from replay.errors import RegistryError, SnapshotError
from replay.metrics import Metric
from replay.code import KernelCode
from replay.registry import BATCHED, REFERENCE, Op, get_op
from replay.snapshot import CallRecord, Snapshot, SnapshotWriter
from replay.tolerance import Tolerance
from replay.ranks.recording import is_collective_op
from replay.torch_ops import rerun as torch_ops_rerun
from replay.triton_launches import relaunch


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
    # check the recorded variant's rerun against the recorded outputs (within the op's tolerance);
    # off for a snapshot recorded on other code, whose outputs are no oracle here (bisect's probes)
    compare_recorded: bool = True
    save_outputs: Path | None = None  # a new snapshot: the recorded inputs, this code's outputs
    readable: bool = False  # what cannot be read is a warning, not bad input: the readable calls decide
    trust_recorded_source: bool = False  # run generated kernels (torch.compile's) from the source recorded
    metric: Metric | None = None  # how comparisons against an oracle pass (None: each op's, else tolerance)
    evidence: bool = False  # keep what a report draws of each failing tensor (replay run --html)
    # one rank of a multi-rank recording, whose collectives are checked across ranks (replay/ranks/):
    # no warning that they are not replayed here
    collectives_elsewhere: bool = False

    @property
    def explicit_tolerance(self) -> Tolerance | None:
        if self.atol is None and self.rtol is None:
            return None
        return Tolerance(self.atol or 0.0, self.rtol or 0.0)


ProgressFn = Callable[[int, int, CallReport], None]
TOLERANCE_UNUSED = ("--atol/--rtol were not used: they apply to --golden-data and to recorded Triton launches and "
                    "torch ops, and this replay had neither")


class CannotMake(Exception):
    """This code cannot make a recorded call (its op or recorded variant is gone): untestable."""


def _variants_to_run(op: Op, recorded_variant: str | None, options: ReplayOptions) -> list[str]:
    backend = options.device
    if recorded_variant is not None and recorded_variant not in op.variants:
        raise CannotMake(f"op '{op.name}' has no variant '{recorded_variant}' in this code "
                          f"(it has: {', '.join(op.variants) or 'none'})")
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
    return _run_and_check(op, inputs, options, recorded, golden)[0]


def _run_and_check(op: Op, inputs: dict[str, Any], options: ReplayOptions, recorded: CallRecord | None,
                   golden: CallRecord | None) -> tuple[CallReport, dict[str, VariantRun]]:
    """check_arguments, and the runs it checked, judged by the metric chosen (the op's or the
    options'), where there is one."""
    report, runs = _run_and_check_within_tolerance(op, inputs, options, recorded, golden)
    metric = options.metric or op.metric
    if metric is not None:
        if metric.needs_float64_run and REFERENCE in runs:
            truth = run_variant(op, op.variants[REFERENCE], checks.in_float64(inputs), options.device, 0)
            checks.float64_errors(runs, truth, report.checks)
        checks.judge_by(report.checks, metric)
    if options.evidence:
        report.evidence = _evidence(op, report, runs, recorded, golden if options.golden else None)
    return report, runs


def _evidence(op: Op, report: CallReport, runs: dict[str, VariantRun], recorded: CallRecord | None,
              golden: CallRecord | None) -> list[Evidence]:
    """What a report draws of each failing tensor, by its most telling failing comparison: the two
    tensors it compared, found again."""
    found = []
    drawn: set[tuple[bool, str]] = set()
    for check in report.failures:
        if check.comparison is None or check.kind in (CheckKind.REPEAT, CheckKind.ERROR, CheckKind.CONTRACT) \
                or (check.kind is CheckKind.TAG, check.name) in drawn:
            continue
        drawn.add((check.kind is CheckKind.TAG, check.name))
        tags = check.kind is CheckKind.TAG
        run = runs.get(BATCHED if check.kind is CheckKind.SINGLE_VS_BATCHED else check.variant)
        actual = (run.tags if tags else run.outputs).get(check.name) if run else None
        if check.against in runs:
            oracle = runs[check.against].tags if tags else runs[check.against].outputs
        else:
            record = golden or recorded
            oracle = record.role("tag" if tags else "out") if record else {}
        expected = oracle.get(check.name)
        if actual is None or expected is None:
            continue
        gathered = evidence.gather(report.index, f"{'tag ' if tags else ''}{check.name}",
                                   f"{check.variant} vs {check.against}", actual, expected,
                                   batch_axis=op.batch_axes.get(check.name))
        if gathered is not None:
            found.append(gathered)
    return found


def _run_and_check_within_tolerance(op: Op, inputs: dict[str, Any], options: ReplayOptions,
                                    recorded: CallRecord | None,
                                    golden: CallRecord | None) -> tuple[CallReport, dict[str, VariantRun]]:
    """Every check, each comparison passing element by element within its tolerance."""
    if options.golden and recorded is None:
        raise ValueError("golden mode needs the recorded call")
    report = CallReport(recorded.index if recorded else -1, op.name, recorded.variant if recorded else "-")
    runs: dict[str, VariantRun] = {}
    try:
        names = _variants_to_run(op, recorded.variant if recorded else None, options)
    except CannotMake as exc:
        report.untestable = str(exc)
        return report, runs
    for name in names:
        runs[name] = run_variant(op, op.variants[name], inputs, options.device, options.tag_level)
        report.variant_seconds[name] = runs[name].seconds
        if runs[name].untestable:
            report.untestable = f"{name}: {runs[name].error}"
        for attempt in range(2, options.repeat + 1):
            again = run_variant(op, op.variants[name], inputs, options.device, options.tag_level)
            report.checks += checks.repeat_checks(runs[name], again, attempt)
    report.checks += checks.error_checks(runs.values())
    recorded_tags = recorded.role("tag") if recorded else {}
    # the recorded outputs are held to the contracts only where they are an oracle: not for a
    # snapshot recorded on other code (--oracle reference), nor against another snapshot's outputs
    if recorded and options.compare_recorded and not options.golden_dir:
        report.checks += checks.contract_checks(op, inputs, recorded.role("out"), recorded_tags,
                                                f"{recorded.variant} (recorded)")
    for run in runs.values():
        if not run.error:
            report.checks += checks.contract_checks(op, inputs, run.outputs, run.tags, run.variant)
    if options.golden:
        oracle = golden or recorded
        assert oracle is not None  # golden mode has the recorded call (checked above)
        against = "golden" if golden else "recorded"
        tol = checks.fixed(options.explicit_tolerance)
        for run in runs.values():
            if run.error:
                continue
            report.checks += checks.against_outputs(op, run, oracle.role("out"), CheckKind.VS_GOLDEN, against, tol)
            oracle_tags = oracle.role("tag")
            report.checks += checks.tag_checks(op, run, oracle_tags, list(oracle_tags), against, tol)
        return report, runs
    report.checks += checks.single_vs_batched(op, runs)
    report.checks += checks.reference_checks(op, runs, list(recorded_tags))
    report.checks += checks.single_vs_batched_tags(op, runs, list(recorded_tags))
    replayed = runs.get(recorded.variant) if recorded else None
    if options.compare_recorded and replayed is not None and not replayed.error:
        assert recorded is not None  # replayed is the run of the recorded variant
        report.checks += checks.against_outputs(op, replayed, recorded.role("out"), CheckKind.VS_RECORDED, "recorded",
                                                op.rerun_tolerance_for)
    return report, runs


def replay_snapshot(path: str | Path, options: ReplayOptions, progress: ProgressFn | None = None) -> RunReport:
    """Replay every selected call of the snapshot at `path`, one call in memory at a time.

    What cannot be read (a damaged index line, a corrupt call file) is kept in the report's
    `problems` and the readable calls are replayed all the same; a call this code cannot make
    (its op or variant gone, its arguments no longer taken) makes the report untestable.
    """
    started = time.perf_counter()
    snapshot = Snapshot(path, strict=False)
    golden_snapshot = Snapshot(options.golden_dir, strict=False) if options.golden_dir else None
    mode = "golden" if options.golden else "variants"
    report = RunReport(str(path), options.device, mode)
    damaged = report.warnings if options.readable else report.problems  # where what cannot be read goes
    damaged += snapshot.problems + (golden_snapshot.problems if golden_snapshot else [])
    chosen = [e for e in snapshot.entries
              if (options.ops is None or e.op in options.ops)
              and (options.calls is None or e.index in options.calls)]
    entries = [e for e in chosen if not is_collective_op(e.op)]  # the other ranks are not here to run them
    if len(entries) < len(chosen) and not options.collectives_elsewhere:
        report.warnings.append(collectives_not_replayed(path, len(chosen) - len(entries)))
    if not chosen and not damaged:
        filtered = options.ops is not None or options.calls is not None
        raise SnapshotError(f"{path}: no calls match the filters ({len(snapshot)} calls recorded)" if filtered
                            else f"{path}: no calls recorded")
    code = KernelCode(options.code_dir, options.providers)
    outputs = _OutputWriter(options.save_outputs, path, options.code_dir) if options.save_outputs else None
    inputs_differ: list[str] = []
    reruns = 0  # recorded Triton launches and torch ops: what --atol/--rtol apply to without golden data
    try:
        for done, entry in enumerate(entries, start=1):
            load_started = time.perf_counter()
            try:
                record = snapshot.load(entry)
                golden = _golden_record(golden_snapshot, entry.index, record) if golden_snapshot else None
            except SnapshotError as exc:  # said (once for all the calls of a damaged segment); the rest replayed
                if str(exc) not in damaged:
                    damaged.append(str(exc))
                continue
            reruns += record.triton is not None or record.torch_op is not None
            if golden is not None and not _same_inputs(record, golden):
                inputs_differ.append(str(entry.index))
            load_seconds = time.perf_counter() - load_started
            try:
                op = op_for(code, record, snapshot, options)
            except CannotMake as exc:
                call_report = CallReport(record.index, record.op, record.variant, untestable=str(exc))
            else:
                call_report, runs = _run_and_check(op, record.arguments(), options, record, golden)
                if outputs is not None:
                    outputs.add(record, runs.get(record.variant))
            call_report.load_seconds = load_seconds
            report.load_seconds += load_seconds
            report.calls.append(call_report)
            if progress:
                progress(done, len(entries), call_report)
            if call_report.untestable or (options.fail_fast and not call_report.passed):
                break
    finally:
        if outputs is not None:
            outputs.close()
    if options.explicit_tolerance is not None and not options.golden and not reruns:
        report.warnings.append(TOLERANCE_UNUSED)
    if inputs_differ:
        report.warnings.append(f"{options.golden_dir}: the inputs of call(s) {', '.join(inputs_differ[:8])}"
                               f"{' and more' if len(inputs_differ) > 8 else ''} differ from {path}'s: its "
                               "outputs were made from other inputs and are no oracle for these")
    if options.golden:
        warning = golden_warning(golden_snapshot.manifest if golden_snapshot else snapshot.manifest,
                                 options.device, code.code_paths(), options.explicit_tolerance is not None)
        report.warnings += [warning] if warning else []
    report.total_seconds = time.perf_counter() - started
    return report


def collectives_not_replayed(path: str | Path, count: int) -> str:
    return (f"{path}: {count} collective call(s) (torch.distributed) are not replayed from one rank's recording: "
            "`replay run` on a multi-rank recording's parent directory checks them across its ranks")


def op_for(code: KernelCode, record: CallRecord, snapshot: Snapshot, options: ReplayOptions) -> Op:
    """The op of a recorded call, its provider imported first (a recorded Triton launch: the op
    that launches its kernel again); CannotMake where this code cannot make the call."""
    where = f"{snapshot.path}: call {record.index}"
    if record.provider == "__main__":  # importing it here would find replay's own script, never the program's
        raise CannotMake(f"{'kernel' if record.triton is not None else 'op'} {record.op}: defined in the recorded "
                         "program's own script, which replay does not run; move it into a module the script "
                         "imports, and record again")
    if record.triton is not None or record.torch_op is not None:
        try:
            if record.triton is not None:
                return relaunch.op_for(code, record, where, options.explicit_tolerance,
                                       snapshot.source if options.trust_recorded_source else None)
            return torch_ops_rerun.op_for(code, record, where, options.explicit_tolerance)
        except relaunch.KernelNotFound as exc:
            raise CannotMake(str(exc)) from None
    if record.provider:
        code.import_provider(record.provider, where)
    try:
        found = get_op(record.op)
    except RegistryError as exc:
        if record.provider and record.declared is not None:  # declared where it was decorated: again, here
            try:
                return declared.declare_again(code, record, where)
            except declared.NotInCode as missing:
                raise CannotMake(str(missing)) from None
        if record.provider:
            raise CannotMake(f"op '{record.op}' is not declared by provider '{record.provider}' in this code") from None
        raise RegistryError(f"{where}: {exc} (no provider recorded)") from None
    if record.declared is not None and found.provider != record.provider:  # a namesake, not the call's op
        raise CannotMake(f"op '{record.op}' is declared here by '{found.provider}', the call's by "
                         f"'{record.provider}'")
    return found


def _golden_record(golden: Snapshot, index: int, record: CallRecord) -> CallRecord:
    other = golden.load(index)
    if other.op != record.op:
        raise SnapshotError(f"{golden.path}: call {index} is op '{other.op}', "
                            f"but the replayed snapshot's call {index} is '{record.op}'")
    return other


def _same_inputs(a: CallRecord, b: CallRecord) -> bool:
    """The same arguments: JSON values equal, input and state tensors the same bits (in any order;
    an output buffer's contents before the call are no input: not compared)."""
    if a.args != b.args:
        return False
    keys = {k for k in a.tensors if k.partition("/")[0] in ("in", "state")} - a.output_buffers
    return keys == {k for k in b.tensors if k.partition("/")[0] in ("in", "state")} - b.output_buffers and all(
        a.tensors[k].shape == b.tensors[k].shape and torch.equal(bit_pattern(a.tensors[k]), bit_pattern(b.tensors[k]))
        for k in keys)


class _OutputWriter:
    """--save-outputs: a snapshot of the recorded inputs with the outputs and tags this code's rerun of
    the recorded variant made, for `--golden-data` later (bisect's good-end oracle)."""

    def __init__(self, path: Path, source: str | Path, code_dir: Path | None):
        self.path = path
        self.writer = SnapshotWriter(path, notes=f"the outputs of {source}'s calls replayed", source_dir=code_dir)

    def add(self, record: CallRecord, run: VariantRun | None) -> None:
        if run is None or run.error:  # nothing to keep: a later comparison says the call is missing
            return
        tensors = {key: t for key, t in record.tensors.items() if key.partition("/")[0] in ("in", "state")}
        tensors.update({f"out/{name}": t for name, t in run.outputs.items()})
        tensors.update({f"tag/{name}": t for name, t in run.tags.items()})
        # stored as the recording stored them: weights once, a cache in chunks (pieces it shares)
        with self._said_as_bad_input():
            self.writer.write_tensors(record.index, record.header(), tensors, blob_keys=record.blobs,
                                      chunk_keys=record.chunked)

    def close(self) -> None:
        with self._said_as_bad_input():
            self.writer.close()

    @contextlib.contextmanager
    def _said_as_bad_input(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:  # a full disk, a file size limit: the place given cannot take them
            raise SnapshotError(f"{self.path}: cannot write the outputs: {exc.strerror or exc}") from None
