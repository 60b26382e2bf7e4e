"""Which pointer parameters a Triton kernel writes through (and reads through), from its source.

A kernel recorded without registration has no `mutates` list: the tensors it writes are found
from its code. A store or atomic (`tl.store(p, ...)`, `tl.atomic_add(p, ...)`, `desc.store(...)`)
writes every parameter its pointer is computed from (`out_ptr + offs`, a block pointer made from
it, a loop variable advanced from it). A parameter handed to a helper `@triton.jit` function is
followed into the helper; handed to anything that cannot be read, it counts as written. The answer
errs on the side of "written": a parameter taken for written costs a copy after the launch, one
missed would lose an output. Reads are found the same way (a load or atomic through a pointer
computed from the parameter, or handed to code that cannot be read): a parameter written and not
read is an output buffer whose contents before the launch are not the kernel's input.

Why the source and not the compiled IR: it is there before the first launch, in the interpreter
(which compiles nothing) as on a GPU, and the same for every specialisation of the kernel.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable, Mapping

WRITING_CALLS = frozenset({"store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min",
                           "atomic_or", "atomic_xchg", "atomic_xor", "store_tensor_descriptor"})
# calls on these roots read their arguments (tl.load, tl.arange, tl.where, math, libdevice)
READING_ROOTS = frozenset({"tl", "triton", "libdevice", "math", "range", "len", "min", "max", "int", "float",
                           "static_range", "static_assert", "static_print", "device_print", "device_assert"})
# calls whose result is data read from memory, whatever pointer they were handed
READ_RESULTS = frozenset({"load", "load_tensor_descriptor"}) | (WRITING_CALLS - {"store", "store_tensor_descriptor"})
MAX_DEPTH = 8  # helpers calling helpers: deeper than this, what they are handed counts as written


def accessed_parameters(fn: Callable[..., Any], source: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """The parameters of the Python function behind a Triton kernel that a written pointer is
    computed from (offsets and sizes too: the caller keeps those it passed a tensor), and those a
    loaded (or atomically updated) pointer is; with the source unreadable, every parameter each."""
    flow = _flow(fn, source, 0)
    if flow is None:
        every = frozenset(inspect.signature(fn).parameters)
        return every, every
    return flow.accessed(WRITING_CALLS), flow.accessed(READ_RESULTS)


def _flow(fn: Callable[..., Any], source: str | None, depth: int) -> "_Flow | None":
    """The def-use of `fn`'s body, parsed once; None where its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(source if source is not None else inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if not defs:
        return None
    return _Flow(defs[0], list(inspect.signature(fn).parameters), getattr(fn, "__globals__", {}), depth)


class _Flow:
    """Def-use over one function body, flow-insensitive: which parameters each name is computed
    from, and which of them the pointers of `through` calls (stores, or loads) are."""

    def __init__(self, node: ast.FunctionDef, params: list[str], globals_: Mapping[str, Any], depth: int):
        self.node, self.globals, self.depth = node, globals_, depth
        self.sources: dict[str, set[str]] = {p: {p} for p in params}
        self._propagate()

    def _propagate(self) -> None:
        assignments = self._assignments()
        changed = True
        while changed:  # to a fixed point: a loop variable may be advanced from itself
            changed = False
            for targets, value in assignments:
                derived = self.derived(value)
                for name in targets:
                    known = self.sources.setdefault(name, set())
                    if not derived <= known:
                        known |= derived
                        changed = True

    def _assignments(self) -> list[tuple[list[str], ast.AST]]:
        found: list[tuple[list[str], ast.AST]] = []
        for node in ast.walk(self.node):
            if isinstance(node, ast.Assign):
                found.append(([n for t in node.targets for n in _names(t)], node.value))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                found.append((_names(node.target), node.value))
            elif isinstance(node, ast.For):
                found.append((_names(node.target), node.iter))
            elif isinstance(node, ast.NamedExpr):
                found.append((_names(node.target), node.value))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                found.append((_names(node.optional_vars), node.context_expr))
        return found

    def derived(self, expr: ast.AST) -> set[str]:
        """The parameters the value of `expr` is computed from. What a load or an atomic returns
        is data read through a pointer, not the pointer: an address computed from it (a position
        read from position_buf) writes where it points, not into the buffer it was read from."""
        out: set[str] = set()
        pending = [expr]
        while pending:
            node = pending.pop()
            if isinstance(node, ast.Call) and _called_name(node.func) in READ_RESULTS:
                continue
            if isinstance(node, ast.Name):
                out |= self.sources.get(node.id, set())
            pending.extend(ast.iter_child_nodes(node))
        return out

    def accessed(self, through: frozenset[str]) -> frozenset[str]:
        """The parameters the pointers handed to `through` calls (stores, or loads) come from."""
        accessed: set[str] = set()
        for node in ast.walk(self.node):
            if isinstance(node, ast.Call):
                accessed |= self._accessed_by(node, through)
        return frozenset(accessed)

    def _accessed_by(self, call: ast.Call, through: frozenset[str]) -> set[str]:
        func = call.func
        name = _called_name(func)
        root = _root(func)
        if name in through:
            if isinstance(func, ast.Attribute) and root not in READING_ROOTS:
                return self.derived(func.value)  # a method: desc.store(offsets, value), ptr.store(...)
            pointer = call.args[0] if call.args else next((k.value for k in call.keywords
                                                           if k.arg in ("pointer", "ptr", "desc")), None)
            return self.derived(pointer) if pointer is not None else set()
        if root in READING_ROOTS:
            return set()
        helper = self._resolve(func)
        if helper is _VALUE_METHOD:  # x_ptr.to(...), offs.reshape(...): a value's own method reads it
            return set()
        return self._into_helper(helper, call, through) if helper is not None else self._handed(call)

    def _resolve(self, func: ast.AST) -> Any:
        """What a called name is in the kernel's globals (`helper`, `module.helper`); _VALUE_METHOD
        for a method of a value computed in the kernel; None when it cannot be told."""
        chain: list[str] = []
        while isinstance(func, ast.Attribute):
            chain.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return _VALUE_METHOD if chain else None
        if func.id in self.sources or func.id not in self.globals:
            return _VALUE_METHOD if chain else None
        found = self.globals[func.id]
        for attr in chain:
            found = getattr(found, attr, None)
        return found

    def _handed(self, call: ast.Call) -> set[str]:
        """Every parameter a call it cannot read is handed."""
        out: set[str] = set()
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            out |= self.derived(arg)
        return out

    def _into_helper(self, helper: Any, call: ast.Call, through: frozenset[str]) -> set[str]:
        """What a helper `@triton.jit` function accesses, mapped back to what it was handed."""
        inner = _python_function(helper)
        if inner is None or self.depth >= MAX_DEPTH:
            return self._handed(call)
        params = list(inspect.signature(inner).parameters)
        flow = _flow(inner, None, self.depth + 1)
        writes = flow.accessed(through) if flow is not None else frozenset(params)
        out: set[str] = set()
        for position, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred) or position >= len(params) or params[position] in writes:
                out |= self.derived(arg)
        for keyword in call.keywords:
            if keyword.arg is None or keyword.arg in writes:
                out |= self.derived(keyword.value)
        return out


_VALUE_METHOD = object()


def _called_name(func: ast.AST) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _python_function(kernel: Any) -> Callable[..., Any] | None:
    """The Python function a Triton JIT function (or interpreted one) wraps; None for anything else."""
    fn = getattr(kernel, "fn", None)
    return fn if inspect.isfunction(fn) else None


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _root(func: ast.AST) -> str | None:
    """The name an attribute chain starts from: `tl` for tl.math.exp; None for a call on a value."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None
