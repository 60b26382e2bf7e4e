"""What a parsed PTX kernel does, and the rules it must keep.

- Shared memory is addressed with 32-bit registers: a 64-bit register (`%rd`) in the address
  of an ld/st/atom/red/cp.async/ldmatrix/stmatrix on `.shared` is a violation (it costs a
  conversion per access, and it is how one batched variant of a real kernel diverged).
- Which grid axes a kernel reads (`%ctaid.x/y/z`): a batched kernel should select its row
  from the axis its op declares, a single-vector one should not read it.
- Which pointer parameters it dereferences, by def-use from `ld.param` through moves,
  `cvta` and address arithmetic to the address of a global load or store: whether a kernel
  reads `position_buf` or takes positions from another argument.
- Local memory: `.local` variables and ld/st on `.local` (spills).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

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
    axes_read: list[str] = field(default_factory=list)
    params_read: list[str] = field(default_factory=list)
    params_written: list[str] = field(default_factory=list)
    local_accesses: int = 0
    violations: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "axes_read": self.axes_read, "params_read": self.params_read,
                "params_written": self.params_written, "local_accesses": self.local_accesses,
                "violations": [v.to_json() for v in self.violations]}


def analyse(function: Function, param_names: Mapping[str, str] | None = None) -> KernelReport:
    """What `function` does and which rules it breaks; `param_names` renames PTX parameters
    (Triton's `<kernel>_param_3`) to the kernel's own argument names."""
    names = param_names or {}
    report = KernelReport(function.name)
    report.violations = shared_address_widths(function)
    report.axes_read = sorted({axis for inst in function.instructions for op in inst.operands
                               for axis in _AXIS.findall(op)})
    read, written = dereferenced_params(function)
    report.params_read, report.params_written = [names.get(p, p) for p in read], [names.get(p, p) for p in written]
    report.local_accesses = sum(1 for inst in function.instructions if "local" in inst.parts[1:]) + \
        sum(1 for space, _, _ in function.variables if space == ".local")
    return report


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
    # cp.async copies global -> shared: only its destination (the first address) is in shared memory
    return addresses[:1] if inst.parts[0] == "cp" else addresses


def dereferenced_params(function: Function) -> tuple[list[str], list[str]]:
    """(params whose pointer reaches a global load's address, ... a global store's), by def-use."""
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
    read, written = set(), set()
    for inst in function.instructions:
        space = set(inst.parts[1:])
        if "param" in space or "shared" in space or "local" in space or "const" in space:
            continue
        addresses = [op for op in inst.operands if op.startswith("[")]
        reached = {p for address in addresses for r in _REGISTER.findall(address) for p in sources.get(r, ())}
        if inst.parts[0] in ("ld", "ldu", "atom", "prefetch") or (inst.parts[0] == "cp" and addresses[1:]):
            read |= reached if inst.parts[0] != "cp" else {p for r in _REGISTER.findall(addresses[1])
                                                           for p in sources.get(r, ())}
        if inst.parts[0] in ("st", "atom", "red"):
            written |= reached
    return sorted(read), sorted(written)


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
