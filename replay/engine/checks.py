"""Turning variant runs into checks: against each other, the reference, the recording."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch

from replay import metrics
from replay.compare import compare
from replay.metrics import Metric
from replay.engine.report import Check, CheckKind
from replay.engine.runner import VariantRun
from replay.registry import BATCHED, REFERENCE, SINGLE, Op
from replay.tolerance import Tolerance

# The tolerance a comparison of a tensor of this dtype gets; None is bitwise.
ToleranceFor = Callable[[torch.dtype], Tolerance | None]


def bitwise(dtype: torch.dtype) -> None:
    return None


def fixed(tolerance: Tolerance | None) -> ToleranceFor:
    """The same tolerance (or bitwise, for None) whatever the dtype."""
    return lambda dtype: tolerance


def error_checks(runs: Iterable[VariantRun]) -> list[Check]:
    return [Check(CheckKind.ERROR, r.variant, "-", "run", False, message=f"{r.variant} failed: {r.error}")
            for r in runs if r.error]


def single_vs_batched(op: Op, runs: Mapping[str, VariantRun]) -> list[Check]:
    """Row-by-row single calls must reproduce the batched call bit for bit."""
    single, batched = runs.get(SINGLE), runs.get(BATCHED)
    if single is None or batched is None or single.error or batched.error:
        return []
    return [Check(CheckKind.SINGLE_VS_BATCHED, BATCHED, SINGLE, name, c.passed, c)
            for name, expected in batched.outputs.items() if name in single.outputs
            for c in [compare(batched.outputs[name], single.outputs[name], None, op.batch_axes.get(name))]]


def single_vs_batched_tags(op: Op, runs: Mapping[str, VariantRun], recorded_tag_order: list[str]) -> list[Check]:
    """Tags both produced, bit for bit (kind 'tag' against single), in recorded order. Checked after
    the reference's tags, so that a divergence from the reference is the one named first."""
    single, batched = runs.get(SINGLE), runs.get(BATCHED)
    if single is None or batched is None or single.error or batched.error:
        return []
    order = recorded_tag_order + [t for t in batched.tags if t not in recorded_tag_order]
    return tag_checks(op, batched, single.tags, order, SINGLE, bitwise)


def against_outputs(op: Op, run: VariantRun, expected: Mapping[str, torch.Tensor], kind: CheckKind,
                    against: str, tolerance: ToleranceFor) -> list[Check]:
    """Compare a run's outputs with `expected`, each within `tolerance(its dtype)`."""
    checks = []
    for name, want in expected.items():
        got = run.outputs.get(name)
        if got is None:
            checks.append(Check(kind, run.variant, against, name, False,
                                message=f"{run.variant} produced no output '{name}' ({against} has it)"))
            continue
        c = compare(got, want, tolerance(got.dtype), op.batch_axes.get(name),
                    same_dtype=kind is not CheckKind.VS_REFERENCE)
        checks.append(Check(kind, run.variant, against, name, c.passed, c))
    return checks


def tag_checks(op: Op, run: VariantRun, expected: Mapping[str, torch.Tensor], order: list[str],
               against: str, tolerance: ToleranceFor) -> list[Check]:
    """Tags shared by the run and `expected`, compared in `order`; first failure first."""
    checks = []
    for name in order:
        got, want = run.tags.get(name), expected.get(name)
        if got is None or want is None:
            continue
        c = compare(got, want, tolerance(got.dtype), op.batch_axes.get(name), same_dtype=False)
        checks.append(Check(CheckKind.TAG, run.variant, against, name, c.passed, c))
    return checks


def contract_checks(op: Op, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor],
                    tags: Mapping[str, torch.Tensor], variant: str) -> list[Check]:
    """Run the op's contracts on the CPU; outputs seen by a contract include the call's tags by name.

    Recorded inputs live on the CPU and replayed outputs on the replay device: one place
    for both keeps every contract free of device bookkeeping.
    """
    inputs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    seen = {k: v.cpu() for k, v in {**tags, **outputs}.items()}
    checks = []
    for contract in op.contracts:
        try:
            violations = contract.check(inputs, seen)
        except Exception as exc:  # a contract that cannot be evaluated is itself a finding
            violations = [f"contract raised {type(exc).__name__}: {exc}"]
        checks.append(Check(CheckKind.CONTRACT, variant, "contract", contract.name, not violations,
                            message="; ".join(f"{contract.name}: {v}" for v in violations)))
    return checks


def repeat_checks(first: VariantRun, again: VariantRun, attempt: int) -> list[Check]:
    """A rerun on the same inputs must give the same bits: otherwise a race."""
    checks = []
    for name, want in first.outputs.items():
        got = again.outputs.get(name)
        if got is None:
            continue
        c = compare(got, want, None)
        if not c.passed:
            checks.append(Check(CheckKind.REPEAT, first.variant, f"run 1 vs run {attempt}", name, False, c,
                                message=(f"{first.variant}: nondeterministic '{name}': run {attempt} differs "
                                         f"from run 1 in {c.mismatches}/{c.numel} elements "
                                         f"({c.first_difference()})")))
    return checks


def reference_checks(op: Op, runs: Mapping[str, VariantRun], recorded_tag_order: list[str]) -> list[Check]:
    """Every variant against the reference: outputs within tolerance, then tags in order."""
    ref = runs.get(REFERENCE)
    if ref is None or ref.error:
        return []
    order = recorded_tag_order + [t for t in ref.tags if t not in recorded_tag_order]
    checks = []
    for name, run in runs.items():
        if name == REFERENCE or run.error:
            continue
        checks += against_outputs(op, run, ref.outputs, CheckKind.VS_REFERENCE, REFERENCE, op.tolerance_for)
        checks += tag_checks(op, run, ref.tags, order, REFERENCE, op.tolerance_for)
    return checks


JUDGED = (CheckKind.VS_REFERENCE, CheckKind.VS_RECORDED, CheckKind.VS_GOLDEN, CheckKind.TAG)


def judge_by(checks: Iterable[Check], metric: Metric) -> None:
    """Let `metric` decide the comparisons against an oracle (bitwise ones between variants and
    runs stay bitwise); the fp64 rule decides only those float64_errors measured."""
    for check in checks:
        c = check.comparison
        if check.kind in JUDGED and c is not None and (not metric.needs_float64_run or c.fp64_error is not None):
            c.judged_by(metric)
            check.passed = c.passed


def float64_errors(runs: Mapping[str, VariantRun], truth: VariantRun, checks: Iterable[Check]) -> None:
    """Each variant's and the reference's distance from a float64 run of the reference, on the
    comparisons against the reference (the accuracy minifier's rule, metric fp64)."""
    reference = runs.get(REFERENCE)
    if reference is None or reference.error or truth.error:
        return
    for check in checks:
        c, run = check.comparison, runs.get(check.variant)
        if check.kind != CheckKind.VS_REFERENCE or c is None or run is None:
            continue
        exact, mine, theirs = (truth.outputs.get(check.name), run.outputs.get(check.name),
                               reference.outputs.get(check.name))
        if exact is None or mine is None or theirs is None or exact.shape != mine.shape:
            continue
        c.fp64_error, c.fp64_reference_error = metrics.rms_error(mine, exact), metrics.rms_error(theirs, exact)
        c.fp64_scale = metrics.rms_error(exact, torch.zeros_like(exact))


def in_float64(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The floating-point tensor arguments as float64, the rest as they are (metric fp64's run)."""
    return {name: value.to(torch.float64) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            for name, value in inputs.items()}
