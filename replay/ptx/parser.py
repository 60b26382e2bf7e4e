"""Parsing PTX into functions, parameters, register declarations and instructions, with line numbers.

The subset compilers emit (nvcc, Triton's LLVM backend) and people write by hand: module
directives (`.version`, `.target`, `.address_size`, `.file`), `.entry` kernels and `.func`
helpers with their `.param` lists, `.reg` declarations with `%r<100>` ranges, `.shared` /
`.local` / `.global` variables, labels, predicated instructions (`@%p1`, `@!%p1`), vector
operands (`{%r1, %r2}`), scoped `{ }` blocks, `.loc` line info and `.section` debug data
(skipped). Anything else is a PTXError naming the file and line.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from replay.errors import ReplayError

_LINE_DIRECTIVES = (".version", ".target", ".address_size", ".file", ".loc")
_NAME = r"[A-Za-z_$%][\w$]*"
_HEADER = re.compile(rf"^(?P<linkage>(\.(visible|extern|weak)\s+)*)\.(?P<kind>entry|func)\s*"
                     rf"(?P<ret>\([^)]*\)\s*)?(?P<name>{_NAME})\s*(\((?P<params>[^)]*)\))?(?P<rest>[^()]*)$", re.S)
_PARAM = re.compile(rf"^\.param\s+(?P<attrs>((\.\w+|\d+)\s+)*)(?P<name>{_NAME})(\[\d*\])?$")
_REG = re.compile(r"^\.reg\s+\.(?P<type>\w+)\s+(?P<names>.+)$", re.S)
_REG_NAME = re.compile(rf"^(?P<name>{_NAME})(<(?P<count>\d+)>)?$")
_LABEL = re.compile(rf"^(?P<label>{_NAME})\s*:")
_INSTRUCTION = re.compile(r"^(?P<pred>@!?%?\w+\s+)?(?P<opcode>[a-z][\w.:]*)(?P<operands>.*)$", re.S)
_VARIABLE = (".shared", ".local", ".global", ".const", ".align", ".extern")
_TYPE_BITS = {"pred": 1}
_OPENS_BLOCK = (".visible", ".entry", ".func", ".weak", ".extern", ".section")
_PARAM_QUALIFIERS = (".ptr", ".align", ".global", ".shared", ".const", ".local")


class PTXError(ReplayError):
    """Malformed PTX: one line naming the file and the line."""


@dataclass(frozen=True)
class Instruction:
    line: int
    opcode: str  # the whole dotted opcode, e.g. "ld.shared.v4.b32"
    operands: tuple[str, ...]
    predicate: str | None = None

    @functools.cached_property
    def parts(self) -> tuple[str, ...]:  # asked for by every rule, for every instruction
        return tuple(self.opcode.split("."))


@dataclass(frozen=True)
class Param:
    name: str
    type: str


@dataclass
class Function:
    name: str
    is_kernel: bool
    line: int
    params: list[Param] = field(default_factory=list)
    register_bits: dict[str, int] = field(default_factory=dict)  # register prefix ("%rd") -> width
    variables: list[tuple[str, str, int]] = field(default_factory=list)  # (state space, name, line)
    labels: dict[str, int] = field(default_factory=dict)  # label -> index of the next instruction
    instructions: list[Instruction] = field(default_factory=list)

    def register_width(self, register: str) -> int | None:
        """Bits of a register like %rd12 (by its declared prefix), None if undeclared (a special register)."""
        return self.register_bits.get(register) or self.register_bits.get(register.rstrip("0123456789"))


@dataclass
class Module:
    source: str
    target: str | None = None
    functions: list[Function] = field(default_factory=list)

    @property
    def kernels(self) -> list[Function]:
        return [f for f in self.functions if f.is_kernel]


def parse(text: str, source: str = "<ptx>") -> Module:
    """The module in PTX `text`; a PTXError names `source` and the line of anything malformed."""
    module = Module(source)
    current: Function | None = None
    depth = 0
    for line, statement, ends in _statements(_strip_comments(text, source), source):
        try:
            if statement.startswith(".section"):
                continue  # debug data; its braces were skipped with it
            if ends == "{":
                if current is None:
                    current = _function_header(statement, line)
                    module.functions.append(current)
                elif statement:
                    raise ValueError(f"unexpected '{statement[:40]}' before '{{'")
                depth += 1
            elif ends == "}":
                if statement:
                    raise ValueError(f"missing ';' after '{statement[:40]}'")
                depth -= 1
                if depth < 0:
                    raise ValueError("'}' without its '{'")
                if depth == 0:
                    current = None
            elif current is None:
                if ends == ":":
                    raise ValueError(f"label '{statement}' outside a function")
                _module_statement(module, statement)
            elif ends == ":":
                current.labels[statement] = len(current.instructions)
            else:
                _body_statement(current, statement, line)
        except ValueError as exc:  # the snippet it quotes may span lines: one line it is
            raise PTXError(f"{source}:{line}: {' '.join(str(exc).split())}") from None
    if depth:
        raise PTXError(f"{source}: ends inside a function body (a '}}' is missing)")
    return module


_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"[^"\n]*"|/\*|"', re.S)
_SPECIAL = re.compile(r"[;{}:\n]")
_SECTION_SPECIAL = re.compile(r"[{}\n]")


def _strip_comments(text: str, source: str) -> str:
    """Comments blanked out, newlines kept, so that line numbers stay right."""
    def blank(match: re.Match) -> str:
        found = match.group()
        if found == "/*":
            raise PTXError(f"{source}:{text.count(chr(10), 0, match.start()) + 1}: unterminated /* comment")
        if found == '"':
            raise PTXError(f"{source}:{text.count(chr(10), 0, match.start()) + 1}: unterminated string")
        if found.startswith("//"):
            return ""
        return "\n" * found.count("\n") if found.startswith("/*") else found
    return _COMMENT_OR_STRING.sub(blank, text)


def _statements(text: str, source: str):
    """(line, statement, how it ended: ';', '{', '}', ':' or 'line') for each statement in order.

    Scans from one statement-ending character to the next (regex search, not a loop per
    character): a statement is the text between them, so its start and line are all it keeps."""
    line, i, end = 1, 0, len(text)
    while True:
        # a new statement: skip the blanks before it, then whole-line directives (.loc, .file)
        while True:
            blanks = re.compile(r"\s*").match(text, i)
            assert blanks is not None  # \s* matches anywhere, if only the empty string
            blank = blanks.end()
            line += text.count("\n", i, blank)
            i = blank
            stop = text.find("\n", i)
            rest = text[i:end if stop < 0 else stop].strip()
            if not (rest.startswith(_LINE_DIRECTIVES) and not rest.endswith(";")):
                break
            yield line, rest, "line"
            i = end if stop < 0 else stop
        if i >= end:
            return
        begin, start_line = i, line
        while True:
            match = _SPECIAL.search(text, i)
            if match is None:
                raise PTXError(f"{source}:{start_line}: statement without its ';' at the end of the file")
            char, at = match.group(), match.start()
            i = at + 1
            if char == "\n":
                line += 1
                continue
            pending = text[begin:at].strip()
            if char == "{" and pending and not pending.startswith(_OPENS_BLOCK):
                close = text.find("}", at)  # a vector operand, { %r1, %r2 }: part of the statement
                if close < 0:
                    raise PTXError(f"{source}:{line}: unclosed vector operand")
                line += text.count("\n", at, close)
                i = close + 1
                continue
            if char == ":" and not (_LABEL.match(pending + ":") and not pending.startswith((".", "@"))
                                    and " " not in pending):
                continue
            yield start_line, pending, char
            if char == "{" and pending.startswith(".section"):
                i, line = _skip_section(text, i, line, source)
            break


def _skip_section(text: str, i: int, line: int, source: str) -> tuple[int, int]:
    """Past the braces of a .section (debug data); returns the position after it and the line there."""
    depth = 1
    while depth:
        match = _SECTION_SPECIAL.search(text, i)
        if match is None:
            raise PTXError(f"{source}: ends inside a .section")
        char, i = match.group(), match.end()
        if char == "\n":
            line += 1
        else:
            depth += 1 if char == "{" else -1
    return i, line


def _function_header(statement: str, line: int) -> Function:
    match = _HEADER.match(" ".join(statement.split()))
    if match is None:
        raise ValueError(f"not a function header: '{statement[:60]}'")
    function = Function(match["name"], match["kind"] == "entry", line)
    for raw in (match["params"] or "").split(","):
        raw = " ".join(raw.split())
        if not raw:
            continue
        param = _PARAM.match(raw)
        if param is None:
            raise ValueError(f"malformed parameter '{raw[:60]}'")
        # the type is the attribute that is not a qualifier (.ptr .global .align N ...)
        types = [t for t in param["attrs"].split() if t.startswith(".") and t not in _PARAM_QUALIFIERS]
        function.params.append(Param(param["name"], types[0] if types else ""))
    return function


def _module_statement(module: Module, statement: str) -> None:
    if statement.startswith(".target"):
        module.target = statement.split(None, 1)[1].split(",")[0].strip() if " " in statement else None
    elif statement and not statement.startswith(_LINE_DIRECTIVES + _VARIABLE + (".visible", ".weak", ".pragma")):
        raise ValueError(f"unexpected '{statement[:40]}' outside a function")


def _body_statement(function: Function, statement: str, line: int) -> None:
    if not statement:
        return
    if statement.startswith(".reg"):
        _register_declaration(function, statement)
    elif statement.startswith(_VARIABLE):
        space = next(s for s in (".shared", ".local", ".global", ".const") if s in statement) \
            if any(s in statement for s in (".shared", ".local", ".global", ".const")) else statement.split()[0]
        function.variables.append((space, statement.split()[-1].split("[")[0], line))
    elif statement.startswith((".loc", ".pragma", ".maxnreg", ".maxntid", ".reqntid")):
        return
    else:
        function.instructions.append(_instruction(statement, line))


def _register_declaration(function: Function, statement: str) -> None:
    match = _REG.match(statement)
    if match is None:
        raise ValueError(f"malformed register declaration '{statement[:60]}'")
    kind = match["type"]
    bits = _TYPE_BITS.get(kind) or int(re.sub(r"\D", "", kind) or 0)
    if not bits:
        raise ValueError(f"register type .{kind} has no width")
    for raw in match["names"].split(","):
        name = _REG_NAME.match(raw.strip())
        if name is None:
            raise ValueError(f"malformed register name '{raw.strip()[:40]}'")
        function.register_bits[name["name"]] = bits


def _instruction(statement: str, line: int) -> Instruction:
    match = _INSTRUCTION.match(" ".join(statement.split()))
    if match is None:
        raise ValueError(f"not an instruction: '{statement[:60]}'")
    return Instruction(line, match["opcode"], tuple(_operands(match["operands"])),
                       match["pred"].strip() if match["pred"] else None)


def _operands(text: str) -> list[str]:
    """Comma-separated operands; a vector `{...}` or an address `[...]` is one operand."""
    current: list[str]  # the characters of the operand being read
    operands, depth, current = [], 0, []
    for char in text:
        if char in "{[(":
            depth += 1
        elif char in "}])":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in operands '{text.strip()[:60]}'")
        if char == "," and depth == 0:
            operands.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced brackets in operands '{text.strip()[:60]}'")
    last = "".join(current).strip()
    if last or operands:
        operands.append(last)
    if any(not op for op in operands):
        raise ValueError(f"empty operand in '{text.strip()[:60]}'")
    return operands
