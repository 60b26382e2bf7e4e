"""Ops, their variants and contracts.

An op knows its argument layout: which axis of which argument or output is the
batch (row) axis, which arguments are runtime state, which are written in place,
its comparison tolerance per dtype, and its contracts. Variants are
implementations; calling one records the call while a recording is active.
"""
from __future__ import annotations

import contextlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import torch

from replay.recorder import intercept
from replay.recorder.staging import CallSpec
from replay.errors import RegistryError
from replay.kernel_rules import KernelRules
from replay.snapshot.schema import check_name
from replay import metrics
from replay.metrics import Metric
from replay.tolerance import DEFAULT, EXACT, Tolerance

F = TypeVar("F", bound=Callable[..., Any])

BACKENDS = ("cpu", "cuda")
REFERENCE, SINGLE, BATCHED = "reference", "single", "batched"


@dataclass
class Variant:
    """One implementation of an op: `fn` as written, `call` the recording wrapper around it."""

    op: "Op"
    name: str
    fn: Callable[..., Any]
    backends: tuple[str, ...]
    call: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


@dataclass(frozen=True)
class Contract:
    """A check on one call that needs no second implementation.

    `check(inputs, outputs)` gets the arguments as recorded before the call (state
    included) and the outputs after it, and returns violations, each one sentence.
    """

    name: str
    check: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]


@dataclass
class Op:
    """A named operation: its argument layout, tolerances, contracts and variants (see `replay.op`)."""

    name: str
    provider: str
    batch_axes: dict[str, int] = field(default_factory=dict)
    state: tuple[str, ...] = ()
    mutates: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    tolerance: dict[torch.dtype, Tolerance] = field(default_factory=dict)
    serial_rows: bool = False
    split_row: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    doc: str = ""
    kernel_rules: KernelRules | None = None
    variants: dict[str, Variant] = field(default_factory=dict)
    contracts: list[Contract] = field(default_factory=list)
    examples: dict[str, Callable[..., dict[str, Any]]] = field(default_factory=dict)
    # a rerun of the recorded variant against the outputs it recorded (None: `tolerance`); a
    # recorded Triton launch or torch op is held to the bit there, to its reference within reason
    rerun_tolerance: Tolerance | None = None
    # how its comparisons pass (None: element-wise within `tolerance`); replay run --metric overrides
    metric: Metric | None = None
    # an op declared where a function was decorated (replay.capture, replay.verify's reference),
    # perhaps outside the function's module: its variants' 'module:qualname' (those importable),
    # state, mutates, outputs, tolerance and metric, written with each call so that a replay
    # declares the op again from trusted code that does not declare it (declared_op)
    declared: dict[str, Any] | None = None

    def variant(self, name: str, *, backends: Iterable[str] = BACKENDS) -> Callable[[F], F]:
        """Decorator registering `fn` as variant `name`, runnable on `backends`.

        Returns `fn` wrapped (name, signature and docstring its own) so that its calls are
        recorded while a recording is active; the registered Variant is its `.variant`.
        A `single` variant refuses a call with more than one row.
        """
        _printable(name, f"op '{self.name}' variant")
        backends = tuple(backends)
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise RegistryError(f"op '{self.name}' variant '{name}': unknown backend(s) {unknown}; known: {list(BACKENDS)}")

        def register(fn: F) -> F:
            spec = CallSpec(self.name, name, self.provider, self.state, self.mutates, self.outputs,
                            header_extra={"declared": self.declared} if self.declared else None)
            # Any: fn wrapped, its parameters its own (an F), with its Variant as an attribute
            captured: Any = intercept.wrap(spec, fn, self._row_limit(fn) if name == SINGLE else None)
            captured.variant = self.variants[name] = Variant(self, name, fn, backends, captured)
            self._keep_canonical_order()
            return captured
        return register

    def _keep_canonical_order(self) -> None:
        """reference, single, batched first, then the others as registered: reports list them so."""
        canonical = (REFERENCE, SINGLE, BATCHED)
        order = sorted(self.variants, key=lambda n: canonical.index(n) if n in canonical else len(canonical))
        self.variants = {n: self.variants[n] for n in order}

    def reference(self, fn: F) -> F:
        """Decorator registering the oracle: plain PyTorch, computed in fp32/fp64."""
        return self.variant(REFERENCE)(fn)

    def single(self, fn: F) -> F:
        """Decorator registering the single-vector kernel (one row: the decode step)."""
        return self.variant(SINGLE)(fn)

    def batched(self, fn: F) -> F:
        """Decorator registering the batched kernel (M rows)."""
        return self.variant(BATCHED)(fn)

    def single_and_batched(self, fn: F) -> F:
        """Decorator registering `fn` as the batched variant and, for one row, the single one.

        For ops whose rows never meet (elementwise, one program a row), where one kernel
        serves both. Returns the batched wrapper; the single one is `op.variants["single"]`.
        """
        self.single(fn)
        return self.batched(fn)

    def _row_limit(self, fn: Callable[..., Any]) -> intercept.RowLimit | None:
        """The guard of a single variant: its parameters with a batch axis hold one row (as rows() counts)."""
        parameters = inspect.signature(fn).parameters
        axes = tuple((name, axis) for name, axis in self.batch_axes.items() if name in parameters)
        return intercept.RowLimit(self.name, axes) if axes else None

    def rows(self, arguments: Mapping[str, Any]) -> int | None:
        """Rows in a call: the extent of the first argument with a batch axis, if any."""
        for name, axis in self.batch_axes.items():
            value = arguments.get(name)
            if isinstance(value, torch.Tensor) and value.dim() > axis:
                return value.shape[axis]
        return None

    def row_arguments(self, arguments: Mapping[str, Any], row: int) -> dict[str, Any]:
        """The arguments of the single-row call for `row`: `split_row`'s, else each batch-axis
        tensor narrowed to that row (a view) and every other argument as it is."""
        if self.split_row is not None:
            return self.split_row(dict(arguments), row)
        return {name: value.narrow(self.batch_axes[name], row, 1)
                if name in self.batch_axes and isinstance(value, torch.Tensor) else value
                for name, value in arguments.items()}

    @contextlib.contextmanager
    def replacing(self, name: str, fn: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
        """Register `fn` as variant `name` inside the block, then restore the variant it replaced.

        For tests that swap in a faulty implementation (see kernels/bugs.py).
        """
        before = self.variants.get(name)
        try:
            yield self.variant(name, backends=before.backends if before else BACKENDS)(fn)
        finally:
            if before is None:
                self.variants.pop(name, None)
            else:
                self.variants[name] = before

    def contract(self, fn: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]) -> Callable:
        """Decorator registering a contract checked on every replayed call of this op."""
        self.contracts.append(Contract(fn.__name__, fn))
        return fn

    def example(self, name: str = "default") -> Callable[[F], F]:
        """Decorator registering `fn(rows, dtype, device) -> arguments`: a small, valid call of this
        op, for tools that run its variants with no recording at hand (`replay ptx OP`). Several
        examples, one per code path (`paged`, `indirect`), each get a name."""
        def register(fn: F) -> F:
            self.examples[name] = fn
            return fn
        return register

    def get(self, variant: str, backend: str | None = None) -> Variant:
        """The variant called `variant`, checked to run on `backend`; clear error otherwise."""
        found = self.variants.get(variant)
        if found is None:
            raise RegistryError(f"op '{self.name}' has no variant '{variant}' "
                                f"(it has: {', '.join(self.variants) or 'none'})")
        if backend is not None and backend not in found.backends:
            raise RegistryError(f"op '{self.name}' variant '{variant}' cannot run on backend '{backend}' "
                                f"(it runs on: {', '.join(found.backends)})")
        return found

    def tolerance_for(self, dtype: torch.dtype) -> Tolerance:
        return self.tolerance.get(dtype) or DEFAULT.get(dtype, EXACT)

    def rerun_tolerance_for(self, dtype: torch.dtype) -> Tolerance:
        return self.rerun_tolerance if self.rerun_tolerance is not None else self.tolerance_for(dtype)


_OPS: dict[str, Op] = {}


def _caller_module(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "__main__")


def op(name: str, *, batch_axes: Mapping[str, int] | None = None, state: Iterable[str] = (),
       mutates: Iterable[str] = (), outputs: Iterable[str] = (),
       tolerance: Tolerance | Mapping[torch.dtype, Tolerance] | None = None,
       serial_rows: bool = False, split_row: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
       doc: str = "", provider: str | None = None, kernel_rules: KernelRules | None = None,
       metric: str | None = None) -> Op:
    """Declare op `name`: the argument layout, tolerance and contracts its variants share.

    Args:
        name: the op's name, as snapshots record it (unique; owned by the declaring module).
        batch_axes: argument or output name -> its batch (row) axis; `single` runs row by row
            along it and failures are reported by row.
        state: arguments that are runtime state (`position_buf`, `seq_len_buf`, ...), stored
            under `state/` in a snapshot.
        mutates: arguments written in place; recorded again after the call as outputs.
        outputs: names of the returned values, in order (default `out`, or `out0`, `out1`, ...).
        tolerance: one Tolerance for every float dtype, or a dict per dtype
            (`replay.tolerance.ELEMENTWISE`, `REDUCTION`, `EXACT`); default `replay.tolerance.DEFAULT`.
        serial_rows: rows replay one after another through shared state (a KV cache), not
            independently.
        split_row: (arguments, row) -> the arguments of the single-row call, where narrowing
            the batch axes is not enough.
        doc: one line on what the op computes, shown by tools.
        provider: the module snapshots name to import the op again (default: the caller's).
        kernel_rules: what its kernels' PTX must show (`replay.KernelRules`: the grid axis
            rows come from, the arguments each launch path reads); checked by `replay ptx`.
        metric: how its comparisons pass instead of element by element within `tolerance`:
            'nmse:1e-6', 'cosine:0.9999', 'fp64:2', ... (replay/metrics.py lists them).

    Returns:
        The Op; its `reference`, `single`, `batched`, `variant(name)` and `contract` decorate
        implementations and checks.

    Example:
        rmsnorm = replay.op("rmsnorm", batch_axes={"x": 0, "out": 0}, tolerance=ELEMENTWISE)

        @rmsnorm.batched
        def rmsnorm_batched(x, weight, eps=1e-6): ...
    """
    _printable(name, "op")
    provider = provider or _caller_module(1)
    existing = _OPS.get(name)
    if existing is not None and existing.provider != provider:
        raise RegistryError(f"op '{name}' is already declared by module '{existing.provider}'")
    if isinstance(tolerance, Tolerance):
        tolerance = {dt: tolerance for dt in DEFAULT}
    try:
        chosen = metrics.parse(metric) if metric is not None else None
    except ValueError as exc:
        raise RegistryError(f"op '{name}': {exc}") from None
    declared = Op(name, provider, dict(batch_axes or {}), tuple(state), tuple(mutates), tuple(outputs),
                  dict(tolerance or {}), serial_rows, split_row, doc, kernel_rules, metric=chosen)
    _OPS[name] = declared
    return declared


_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)


def import_path(fn: Callable[..., Any]) -> str | None:
    """'module:qualname', where a replay can import `fn` by it: a plain function (no method bound to
    an object, partial or callable object), not the script's (`__main__`), local or a lambda."""
    if not inspect.isfunction(fn) or fn.__module__ == "__main__":
        return None
    path = f"{fn.__module__}:{fn.__qualname__}"
    return path if _IMPORT_PATH.fullmatch(path) else None


def declaration(variants: Mapping[str, str], state: Iterable[str] = (), mutates: Iterable[str] = (),
                outputs: Iterable[str] = (), tolerance: Tolerance | None = None,
                metric: str | None = None) -> dict[str, Any]:
    """An Op's `declared`: `variants` by name to their import_path, and what the op declares."""
    return {"variants": dict(variants), "state": list(state), "mutates": list(mutates), "outputs": list(outputs),
            "tolerance": None if tolerance is None else {"rtol": tolerance.rtol, "atol": tolerance.atol},
            "metric": metric}


def declared_op(name: str, provider: str, declared: Mapping[str, Any],
                functions: Mapping[str, Callable[..., Any]]) -> Op:
    """Op `name` declared again from what its calls recorded (`declared`), each variant's function
    in `functions` (a replay, where trusted code does not declare it)."""
    tolerance = declared.get("tolerance")
    made = op(name, state=declared.get("state", ()), mutates=declared.get("mutates", ()),
              outputs=declared.get("outputs", ()), metric=declared.get("metric"), provider=provider,
              tolerance=Tolerance(rtol=tolerance["rtol"], atol=tolerance["atol"]) if tolerance else None)
    made.declared = dict(declared)
    for variant, fn in functions.items():
        made.variant(variant)(fn)
    return made


def capture(op_name: str, variant: str = "default", *, state: Iterable[str] = (),
            mutates: Iterable[str] = (), outputs: Iterable[str] = (),
            backends: Iterable[str] = BACKENDS) -> Callable[[F], F]:
    """Decorator that registers any function as variant `variant` of op `op_name`, so that its
    calls are recorded while a recording is active and replay like any registered op's.

    The op is declared by the decorated function's module if nobody has declared it; if
    somebody has, `state`, `mutates` and `outputs` must match the declaration.

    Args:
        op_name: the op the function implements.
        variant: the variant's name (`reference`, `single`, `batched` or your own).
        state, mutates, outputs: as for `replay.op`.
        backends: where the function can run (`cpu`, `cuda`).

    Returns:
        A decorator returning the function wrapped (its name, signature and docstring kept);
        the registered Variant is its `.variant`.

    Example:
        @replay.capture("kv_scatter", variant="batched", state=("position_buf",), mutates=("cache",))
        def my_scatter(k, cache, position_buf): ...
    """
    state, mutates, outputs = tuple(state), tuple(mutates), tuple(outputs)

    def register(fn: F) -> F:
        found = _OPS.get(op_name)
        if found is None:
            found = op(op_name, state=state, mutates=mutates, outputs=outputs, provider=fn.__module__)
            if _caller_module(1) != fn.__module__:  # decorated elsewhere: its calls say where fn lives
                found.declared = declaration({}, state, mutates, outputs)
        elif (state, mutates, outputs) != (found.state, found.mutates, found.outputs) and (state or mutates or outputs):
            raise RegistryError(f"op '{op_name}' is declared with state={found.state}, mutates={found.mutates}, "
                                f"outputs={found.outputs}; capture of '{fn.__qualname__}' asks for "
                                f"state={state}, mutates={mutates}, outputs={outputs}")
        path = import_path(fn)
        if found.declared is not None and path is not None:  # a new dict: a writer may be reading the last
            found.declared = {**found.declared, "variants": {**found.declared["variants"], variant: path}}
        return found.variant(variant, backends=backends)(fn)
    return register


def _printable(name: str, what: str) -> None:
    """Names are recorded, then printed and made paths by the tools that read them: text only."""
    try:
        check_name(name, what)
    except ValueError as exc:
        raise RegistryError(str(exc)) from None


def get_op(name: str) -> Op:
    """The op declared as `name`; a RegistryError lists the registered ones otherwise."""
    found = _OPS.get(name)
    if found is None:
        raise RegistryError(f"unknown op '{name}' (registered: {', '.join(sorted(_OPS)) or 'none'})")
    return found


def all_ops() -> dict[str, Op]:
    return dict(_OPS)
