"""What an op's compiled kernels must show in their PTX: a small table declared with the op
(`replay.op(..., kernel_rules=KernelRules(...))`) and checked by `replay ptx`. Data only: the
analyser (replay/ptx) reads it, so a rule is added without touching the analyser.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from replay.errors import RegistryError

AXES = ("x", "y", "z")


@dataclass(frozen=True)
class KernelRules:
    """Rules for the Triton kernels an op's variants launch.

    row_axis: the grid axis (`x`, `y`, `z`) a batched variant's kernel selects its row from:
        every kernel the batched variant launches reads `%ctaid.<row_axis>`, and a single
        variant's kernel reads it only where it launches one program along it (a shared
        kernel run for one row). A batched kernel that never reads it computes every row
        from row 0's coordinates.
    ignore_when_given: argument -> arguments the kernels must not dereference when the call
        gives that argument (not None): a KV scatter handed `positions` must not read
        `position_buf`, which may be stale (a CUDA-graph buffer of an earlier step).

    Example:
        KernelRules(row_axis="x", ignore_when_given={"positions": ("position_buf",)})
    """

    row_axis: str | None = None
    ignore_when_given: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.row_axis is not None and self.row_axis not in AXES:
            raise RegistryError(f"KernelRules: row_axis {self.row_axis!r} is not one of {', '.join(AXES)}")
        table = self.ignore_when_given
        if not all(isinstance(given, str) and isinstance(ignored, tuple) and all(isinstance(x, str) for x in ignored)
                   for given, ignored in table.items()):
            raise RegistryError(f"KernelRules: ignore_when_given maps an argument to a tuple of argument names, "
                                f"got {table!r}")

    def to_json(self) -> dict[str, Any]:
        return {"row_axis": self.row_axis,
                "ignore_when_given": {given: list(ignored) for given, ignored in self.ignore_when_given.items()}}
