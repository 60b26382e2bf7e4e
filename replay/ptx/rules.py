"""What a parsed PTX kernel does, and the rules it must keep.

- Shared memory is addressed with 32-bit registers: a 64-bit register (`%rd`) in the address
  of an ld/st/atom/red/cp.async/ldmatrix/stmatrix on `.shared` is a violation (it costs a
  conversion per access, and it is how one batched variant of a real kernel diverged).
- Which grid axes a kernel reads (`%ctaid.x/y/z`): with the op's rules (replay.KernelRules), a
  batched kernel must read the axis its rows come from, a single-vector one must not.
- Which pointer parameters it dereferences, by def-use from `ld.param` through moves,
  `cvta` and address arithmetic to the address of a global load or store; with the launch's
  `binds`, which call arguments those are (does it read `position_buf`?), and the op's rule
  on what it must ignore when the call gives another argument (`positions`).
- Local memory: `.local` variables and ld/st on `.local` (spills).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from replay.kernel_rules import AXES, KernelRules
from replay.ptx.parser import Function, Instruction

SHARED_ACCESS = ("ld", "st", "atom", "red", "cp", "ldmatrix", "stmatrix")
_REGISTER = re.compile(r"%[A-Za-z_]\w*")
_AXIS = re.compile(r"%ctaid\.([xyz])")
_POINTER_TYPES = (".u64", ".b64", ".s64")
_LOADS = ("ld", "ldu", "atom", "ldmatrix")
# instructions whose first operand is not a register they write
_NO_DESTINATION = ("st", "red", "bra", "ret", "exit", "bar", "barrier", "membar", "fence", "cp", "stmatrix",
                   "prefetch", "trap", "call")


@dataclass
class Finding:
    rule: str
    line: int
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "line": self.line, "message": self.message}


@dataclass
class KernelReport:
    name: str
    line: int = 0
    axes_read: list[str] = field(default_factory=list)
    params_read: list[str] = field(default_factory=list)
    params_written: list[str] = field(default_factory=list)
    arguments_read: list[str] = field(default_factory=list)  # the call's arguments behind params_read
    local_accesses: int = 0
    violations: list[Finding] = field(default_factory=list)
    param_lines: dict[str, int] = field(default_factory=dict)  # param -> line of its first dereference
    axis_lines: dict[str, int] = field(default_factory=dict)  # axis -> line that first reads it

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "line": self.line, "axes_read": self.axes_read, "params_read": self.params_read,
                "params_written": self.params_written, "arguments_read": self.arguments_read,
                "local_accesses": self.local_accesses, "violations": [v.to_json() for v in self.violations]}


def analyse(function: Function, param_names: Mapping[str, str] | None = None,
            binds: Mapping[str, str] | None = None) -> KernelReport:
    """What `function` does and which rules it breaks; `param_names` renames PTX parameters
    (Triton's `<kernel>_param_3`) to the kernel's own argument names, `binds` maps those to
    the call's arguments (a launch record's `binds`)."""
    names, binds = param_names or {}, binds or {}
    report = KernelReport(function.name, function.line)
    report.violations = shared_address_widths(function)
    for inst in function.instructions:
        for op in inst.operands:
            for axis in _AXIS.findall(op):
                report.axis_lines.setdefault(axis, inst.line)
    report.axes_read = sorted(report.axis_lines)
    read, written = dereferenced_params(function)
    report.params_read, report.params_written = [names.get(p, p) for p in read], [names.get(p, p) for p in written]
    report.param_lines = {names.get(p, p): line for p, line in read.items()}
    report.arguments_read = sorted({binds[p] for p in report.params_read if p in binds})
    report.local_accesses = sum(1 for inst in function.instructions if "local" in inst.parts[1:]) + \
        sum(1 for space, _, _ in function.variables if space == ".local")
    return report


def op_rule_findings(report: KernelReport, rules: KernelRules, variant: str | None,
                     grid: list[int] | None = None, binds: Mapping[str, str] | None = None,
                     given: Collection[str] = ()) -> list[Finding]:
    """Where `report` (a kernel that `variant` of an op launched with `grid`, handed the call's
    arguments as `binds` says, in a call that gave the arguments `given`) breaks the op's rules:
    the row axis a batched kernel must read and a single one must not, and the arguments it must
    ignore when the call gives another."""
    found = []
    axis = rules.row_axis
    if axis is not None and variant == "batched" and axis not in report.axes_read:
        found.append(Finding("row-axis", report.line, f"batched kernel never reads %ctaid.{axis}, the axis its rows "
                                                      f"come from: every program computes the same row"))
    programs = grid[AXES.index(axis)] if axis is not None and grid and len(grid) > AXES.index(axis) else None
    if axis is not None and variant == "single" and axis in report.axes_read and programs != 1:
        found.append(Finding("row-axis", report.axis_lines[axis], f"single-vector kernel reads %ctaid.{axis}, the "
                                                                  f"batched row axis"))
    readers = {argument: param for param, argument in (binds or {}).items() if param in report.param_lines}
    for argument, ignored in rules.ignore_when_given.items():
        for stale in (a for a in ignored if argument in given and a in readers):
            found.append(Finding("ignore-when-given", report.param_lines[readers[stale]],
                                 f"reads {stale} (through {readers[stale]}) although the call gives {argument}"))
    return found


def shared_address_widths(function: Function) -> list[Finding]:
    """Each .shared access whose address is held in a 64-bit register."""
    found = []
    for inst in function.instructions:
        if inst.parts[0] not in SHARED_ACCESS or not any(p.startswith("shared") for p in inst.parts[1:]):
            continue
        for address in _shared_addresses(inst):
            for register in _REGISTER.findall(address):
                if function.register_width(register) == 64:
                    found.append(Finding("shared-32-bit", inst.line,
                                         f"{inst.opcode} addresses shared memory with 64-bit {register}"))
    return found


def _shared_addresses(inst: Instruction) -> list[str]:
    addresses = [op for op in inst.operands if op.startswith("[")]
    if inst.parts[0] != "cp":
        return addresses
    # a copy names its destination's and its source's state spaces in operand order (cp.async.ca.shared.global,
    # cp.async.bulk.tensor.2d.global.shared::cta: the global one a tensor map); an address after those two
    # is an mbarrier's, in shared memory
    spaces = [part.split("::")[0] for part in inst.parts[1:] if part.split("::")[0] in ("shared", "global")][:2]
    return [a for a, space in zip(addresses, spaces) if space == "shared"] + addresses[len(spaces):]


def dereferenced_params(function: Function) -> tuple[dict[str, int], dict[str, int]]:
    """Params whose pointer reaches a global load's address, and a global store's, by def-use; each
    with the line of its first such access."""
    sources: dict[str, set[str]] = {}  # register -> the pointer params its value derives from
    param_names = {p.name for p in function.params if p.type in _POINTER_TYPES}
    changed = True
    while changed:  # to a fixed point: loops carry addresses around back edges
        changed = False
        for inst in function.instructions:
            defs, derived = _definition(inst, param_names, sources)
            for register in defs:
                if not derived <= sources.get(register, set()):
                    sources[register] = sources.get(register, set()) | derived
                    changed = True
    read: dict[str, int] = {}
    written: dict[str, int] = {}
    for inst in function.instructions:
        space = set(inst.parts[1:])
        if "param" in space or "shared" in space or "local" in space or "const" in space:
            continue
        addresses = [op for op in inst.operands if op.startswith("[")]
        reached = {p for address in addresses for r in _REGISTER.findall(address) for p in sources.get(r, ())}
        if inst.parts[0] in ("ld", "ldu", "atom", "prefetch") or (inst.parts[0] == "cp" and addresses[1:]):
            loaded = reached if inst.parts[0] != "cp" else {p for r in _REGISTER.findall(addresses[1])
                                                            for p in sources.get(r, ())}
            for param in loaded:
                read.setdefault(param, inst.line)
        if inst.parts[0] in ("st", "atom", "red"):
            for param in reached:
                written.setdefault(param, inst.line)
    return dict(sorted(read.items())), dict(sorted(written.items()))


def _definition(inst: Instruction, params: set[str], sources: dict[str, set[str]]) -> tuple[list[str], set[str]]:
    """The registers `inst` writes, and the params their values derive from."""
    if inst.parts[0] in _NO_DESTINATION or not inst.operands:
        return [], set()
    destination, *inputs = inst.operands
    defs = _REGISTER.findall(destination)
    if inst.parts[0] == "ld" and "param" in inst.parts[1:]:
        name = inputs[0].strip("[]").split("+")[0].strip() if inputs else ""
        return defs, {name} if name in params else set()
    if inst.parts[0] in _LOADS:  # what memory holds is data: a pointer read from it is not the parameter's
        return defs, set()
    return defs, {p for op in inputs for r in _REGISTER.findall(op) for p in sources.get(r, ())}
