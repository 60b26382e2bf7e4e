"""Arguments for one call of each kernel op (kernels/examples.py makes them, small enough for the
Triton interpreter), and the replay engine's checks on such a call."""
from __future__ import annotations

from typing import Any

import torch

from replay_kernels.examples import make  # noqa: F401 (the tests' one way to build a call)
from replay.engine import CallReport, Check, ReplayOptions, check_arguments
from replay.registry import get_op

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check(op: str, args: dict[str, Any], device: str, *variants: str) -> CallReport:
    """The replay engine's checks of `op` on `args`: every variant, or only `variants` (and the
    reference), against each other, the reference and the op's contracts."""
    options = ReplayOptions(device=device, variants=frozenset(variants) or None)
    return check_arguments(get_op(op), args, options)


def against(report: CallReport, oracle: str) -> list[Check]:
    """The report's checks against `oracle` ('single', 'reference'), and the errors of variants
    that did not run; asserts there is at least one, so that a check cannot pass by not running."""
    found = [c for c in report.checks if c.against == oracle or c.kind == "error"]
    assert found, f"op '{report.op}': nothing was checked against {oracle}"
    return found


def contract_violations(report: CallReport, variant: str) -> list[str]:
    """The violations the op's contracts found in `variant`'s run, one an item (each contract's
    check describes them as `name: violation; name: violation`)."""
    found = [c for c in report.checks if c.kind == "contract" and c.variant == variant]
    assert found, f"op '{report.op}': no contract was checked on {variant}"
    return [v for c in found if not c.passed
            for v in c.describe().removeprefix(f"{c.name}: ").split(f"; {c.name}: ")]


def explain(report: CallReport, checks: list[Check] | None = None) -> str:
    """The op, then each failing check (variant, output or tag, rows, first differing element)."""
    failing = report.failures if checks is None else [c for c in checks if not c.passed]
    return f"op '{report.op}': " + "; ".join(c.describe() for c in failing)
