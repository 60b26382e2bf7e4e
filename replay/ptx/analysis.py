"""Checking PTX sources: parse each, pick its kernels, analyse them against the general rules and
their op's, say whether every rule holds, and set each op's batched and single kernels side by side."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Iterable

from replay.errors import ReplayError
from replay.ptx.parser import Module, parse
from replay.ptx.rules import KernelReport, analyse, op_rule_findings
from replay.ptx.sources import PtxSource

# what a batched/single pair is compared on
_COMPARED = ("constexprs", "axes_read", "params_read", "params_written", "arguments_read", "shared_64bit", "local_accesses",
             "registers", "stack", "shared")


@dataclass
class CheckedKernel:
    source: PtxSource
    report: KernelReport

    def facts(self) -> dict[str, Any]:
        """What a batched/single pair is compared on."""
        report = self.report
        return {"constexprs": self.source.constexprs, "axes_read": report.axes_read, "params_read": report.params_read,
                "params_written": report.params_written, "arguments_read": report.arguments_read,
                "shared_64bit": sum(v.rule == "shared-32-bit" for v in report.violations),
                "local_accesses": report.local_accesses, "registers": self.source.registers,
                "stack": self.source.stack, "shared": self.source.shared}

    def to_json(self) -> dict[str, Any]:
        s = self.source
        return {"file": s.where, **self.report.to_json(), "op": s.op, "variant": s.variant, "example": s.example,
                "arch": f"sm_{s.arch}" if s.arch else None, "path": s.path, "constexprs": s.constexprs,
                "binds": s.binds, "registers": s.registers, "stack": s.stack,
                "shared": s.shared}


@dataclass
class PairDifference:
    """An op's batched and single kernels for one example and target, where they differ."""

    op: str
    example: str | None
    arch: int | None
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # fact -> (batched, single)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "example": self.example, "arch": f"sm_{self.arch}" if self.arch else None,
                "differences": {k: {"batched": b, "single": s} for k, (b, s) in self.differences.items()}}


@dataclass
class PtxReport:
    kernels: list[CheckedKernel]
    uncompiled: list[PtxSource] = field(default_factory=list)  # launches whose kernel did not compile (their `error`)

    @property
    def passed(self) -> bool:
        return not any(k.report.violations for k in self.kernels)

    def pairs(self) -> list[PairDifference]:
        """Each op's batched and single kernels of the same example and target, where they differ."""
        by_key: dict[tuple, dict[str, CheckedKernel]] = {}
        for kernel in self.kernels:
            s = kernel.source
            if s.op is not None and s.variant in ("batched", "single"):
                key = (s.op, s.example, s.arch, s.path, kernel.report.name)
                by_key.setdefault(key, {}).setdefault(s.variant, kernel)
        found = []
        for (op, example, arch, _, _), pair in by_key.items():
            if len(pair) == 2:
                batched, single = pair["batched"].facts(), pair["single"].facts()
                differences = {k: (batched[k], single[k]) for k in _COMPARED if batched[k] != single[k]}
                found.append(PairDifference(op, example, arch, differences))
        return found

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "kernels": [k.to_json() for k in self.kernels],
                "pairs": [p.to_json() for p in self.pairs()],
                "uncompiled": [{"file": s.where, "arch": f"sm_{s.arch}" if s.arch else None, "op": s.op,
                                "variant": s.variant, "error": s.error} for s in self.uncompiled]}


def check_sources(sources: Iterable[PtxSource], kernel_glob: str = "*") -> PtxReport:
    """Every kernel matching `kernel_glob` in `sources`, analysed, with its op's rules applied; the
    sources whose kernel did not compile, set apart."""
    sources = list(sources)
    checked = []
    uncompiled = [source for source in sources
                  if source.error is not None and fnmatch.fnmatchcase(source.kernel or "", kernel_glob)]
    modules: dict[str, Module] = {}  # single and batched launches, and targets, often share PTX
    for source in sources:
        if source.error is not None:
            continue
        if source.text not in modules:
            modules[source.text] = parse(source.text, source.where)
        for kernel in modules[source.text].kernels:
            if fnmatch.fnmatchcase(kernel.name, kernel_glob):
                report = analyse(kernel, source.param_names, source.binds)
                if source.rules is not None:
                    report.violations += op_rule_findings(report, source.rules, source.variant, source.grid,
                                                          source.binds, source.given)
                checked.append(CheckedKernel(source, report))
    if not checked and not uncompiled:
        raise ReplayError(f"no kernel matching {kernel_glob!r} in {', '.join(s.where for s in sources)}")
    return PtxReport(checked, uncompiled)
