"""Checking PTX sources: parse each, pick its kernels, analyse them, and say whether every rule holds."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Iterable

from replay.errors import ReplayError
from replay.ptx.parser import parse
from replay.ptx.rules import KernelReport, analyse


@dataclass
class PtxReport:
    kernels: list[tuple[str, KernelReport]]  # (where the PTX came from, its kernel's report)

    @property
    def passed(self) -> bool:
        return not any(report.violations for _, report in self.kernels)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "kernels": [{"file": where, **report.to_json()} for where, report in self.kernels]}


def check_sources(sources: Iterable[tuple[str, str, dict[str, str]]], kernel_glob: str = "*") -> PtxReport:
    """Every kernel matching `kernel_glob` in (where, PTX text, parameter renames) sources, analysed."""
    sources = list(sources)
    kernels = [(where, analyse(kernel, names)) for where, text, names in sources
               for kernel in parse(text, where).kernels if fnmatch.fnmatchcase(kernel.name, kernel_glob)]
    if not kernels:
        raise ReplayError(f"no kernel matching {kernel_glob!r} in {', '.join(w for w, _, _ in sources)}")
    return PtxReport(kernels)
