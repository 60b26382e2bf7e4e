"""The results of a replay: checks per call, and the run's verdict."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from replay.compare import Comparison, row_ranges


class CheckKind(str, Enum):
    """What a check compares. Declared in the order that explains a failing call best, most telling first."""

    ERROR = "error"  # a variant raised
    CONTRACT = "contract"  # a rule on the call's inputs and outputs
    SINGLE_VS_BATCHED = "single-vs-batched"  # row-by-row single calls against the batched call, bitwise
    VS_REFERENCE = "vs-reference"  # a variant against the reference, within the op's tolerance
    VS_GOLDEN = "vs-golden"  # the rerun against the recorded (or given) outputs
    VS_RECORDED = "vs-recorded"  # the recorded variant's rerun against its recorded outputs
    REPEAT = "repeat"  # a rerun against the first run, bitwise (nondeterminism)
    TAG = "tag"  # an intermediate against the same tag of the oracle

    def __str__(self) -> str:
        return self.value


_TELLING_ORDER = list(CheckKind)


@dataclass
class Check:
    """One comparison or contract on one call."""

    kind: CheckKind
    variant: str
    against: str
    name: str
    passed: bool
    comparison: Comparison | None = None
    message: str = ""

    @property
    def bad_rows(self) -> list[int]:
        """The rows (along the batch axis) with at least one mismatch."""
        return self.comparison.bad_rows if self.comparison else []

    def describe(self) -> str:
        if self.message:
            return self.message
        c = self.comparison
        if c is None:
            return f"{self.variant} vs {self.against}: {self.name}"
        text = f"{self.variant} vs {self.against}: '{self.name}' differs in {c.mismatches}/{c.numel} elements"
        if c.metric is not None and not c.passed:
            text = f"{self.variant} vs {self.against}: '{self.name}' fails {c.metric}: {c.metric_value()}"
        if c.problem:
            text = f"{self.variant} vs {self.against}: '{self.name}': {c.problem}"
        if c.bad_rows:
            text += f"; rows {row_ranges(c.bad_rows)} of {c.rows} wrong"
        first = c.first_difference()
        if first:
            text += f"; {first}"
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "variant": self.variant, "against": self.against,
                               "name": self.name, "passed": self.passed, "description": self.describe()}
        if self.comparison is not None:
            out["comparison"] = self.comparison.to_json()
        return out


@dataclass
class CallReport:
    index: int
    op: str
    recorded_variant: str
    checks: list[Check] = field(default_factory=list)
    variant_seconds: dict[str, float] = field(default_factory=dict)
    load_seconds: float = 0.0
    untestable: str | None = None
    evidence: list[Any] = field(default_factory=list)  # engine/evidence.py's, when a page is drawn

    @property
    def passed(self) -> bool:
        return self.untestable is None and all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return sorted((c for c in self.checks if not c.passed), key=lambda c: _TELLING_ORDER.index(c.kind))

    def first_tag(self) -> Check | None:
        """The first tag, in recorded order, that diverged (checks keep that order)."""
        return next((c for c in self.checks if c.kind is CheckKind.TAG and not c.passed), None)

    def to_json(self) -> dict[str, Any]:
        tag = self.first_tag()
        return {"index": self.index, "op": self.op, "recorded_variant": self.recorded_variant,
                "passed": self.passed, "untestable": self.untestable,
                "first_divergent_tag": tag.to_json() if tag else None,
                "load_seconds": self.load_seconds, "variant_seconds": self.variant_seconds,
                "checks": [c.to_json() for c in self.checks]}


@dataclass
class RunReport:
    snapshot: str
    device: str
    mode: str
    calls: list[CallReport] = field(default_factory=list)
    load_seconds: float = 0.0
    total_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be read: bad input, named

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.calls)

    @property
    def untestable(self) -> str | None:
        return next((c.untestable for c in self.calls if c.untestable), None)

    @property
    def first_failure(self) -> CallReport | None:
        return next((c for c in self.calls if not c.passed), None)

    def summary(self) -> dict[str, Any] | None:
        """The first diverging call, its most telling failure, and its first diverging tag."""
        call = self.first_failure
        if call is None:
            return None
        top = call.failures[0] if call.failures else None
        # A contract names no rows; the most telling failure that does supplies them.
        with_rows = next((c for c in call.failures if c.bad_rows), None)
        tag = call.first_tag()
        return {"call": call.index, "op": call.op, "variant": top.variant if top else None,
                "kind": top.kind.value if top else None, "rows": with_rows.bad_rows if with_rows else [],
                "rows_total": with_rows.comparison.rows if with_rows and with_rows.comparison else None,
                "description": top.describe() if top else call.untestable,
                "tag": tag.name if tag else None, "tag_rows": tag.bad_rows if tag else [],
                "tag_description": tag.describe() if tag else None}

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "device": self.device, "mode": self.mode,
                "passed": self.passed, "untestable": self.untestable, "warnings": self.warnings,
                "problems": self.problems,
                "calls_checked": len(self.calls),
                "calls_failed": sum(not c.passed for c in self.calls),
                "first_divergence": self.summary(), "load_seconds": self.load_seconds,
                "total_seconds": self.total_seconds, "calls": [c.to_json() for c in self.calls]}
