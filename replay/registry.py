"""Ops, their variants and contracts.

An op knows its argument layout: which axis of which argument or output is the
batch (row) axis, which arguments are runtime state, which are written in place,
its comparison tolerance per dtype, and its contracts. Variants are
implementations; calling one records the call while a recording is active.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from replay import recorder as _recorder
from replay.errors import ProviderImportError, RegistryError

BACKENDS = ("cpu", "cuda")
REFERENCE, SINGLE, BATCHED = "reference", "single", "batched"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-9, 1e-9),
    torch.float32: Tolerance(1e-5, 1e-4),
    torch.float16: Tolerance(2e-3, 2e-3),
    torch.bfloat16: Tolerance(1.6e-2, 1.6e-2),
}
EXACT = Tolerance(0.0, 0.0)


@dataclass
class Variant:
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
    variants: dict[str, Variant] = field(default_factory=dict)
    contracts: list[Contract] = field(default_factory=list)

    def variant(self, name: str, *, backends: Iterable[str] = BACKENDS) -> Callable[[Callable], Variant]:
        """Decorator registering `fn` as variant `name`, runnable on `backends`."""
        backends = tuple(backends)
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise RegistryError(f"op '{self.name}' variant '{name}': unknown backend(s) {unknown}; known: {list(BACKENDS)}")

        def register(fn: Callable) -> Variant:
            spec = _recorder.CallSpec(self.name, name, self.provider, self.state, self.mutates, self.outputs)
            v = Variant(self, name, fn, backends, _recorder.wrap(spec, fn))
            self.variants[name] = v
            return v
        return register

    def reference(self, fn: Callable) -> Variant:
        return self.variant(REFERENCE)(fn)

    def single(self, fn: Callable) -> Variant:
        return self.variant(SINGLE)(fn)

    def batched(self, fn: Callable) -> Variant:
        return self.variant(BATCHED)(fn)

    def contract(self, fn: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]) -> Callable:
        """Decorator registering a contract checked on every replayed call of this op."""
        self.contracts.append(Contract(fn.__name__, fn))
        return fn

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
        return self.tolerance.get(dtype) or DEFAULT_TOLERANCES.get(dtype, EXACT)


_OPS: dict[str, Op] = {}


def _caller_module(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "__main__")


def op(name: str, *, batch_axes: Mapping[str, int] | None = None, state: Iterable[str] = (),
       mutates: Iterable[str] = (), outputs: Iterable[str] = (),
       tolerance: Tolerance | Mapping[torch.dtype, Tolerance] | None = None,
       serial_rows: bool = False, split_row: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
       doc: str = "", provider: str | None = None) -> Op:
    """Declare op `name`. The declaring module is its provider, recorded in snapshots.

    batch_axes: argument or output name -> its row axis. state: arguments that are
    runtime state. mutates: arguments written in place. serial_rows: rows replay one
    after another through shared state (a KV cache), not independently. split_row:
    optional (arguments, row) -> arguments of the single-row call.
    """
    provider = provider or _caller_module(1)
    existing = _OPS.get(name)
    if existing is not None and existing.provider != provider:
        raise RegistryError(f"op '{name}' is already declared by module '{existing.provider}'")
    if isinstance(tolerance, Tolerance):
        tolerance = {dt: tolerance for dt in DEFAULT_TOLERANCES}
    declared = Op(name, provider, dict(batch_axes or {}), tuple(state), tuple(mutates), tuple(outputs),
                  dict(tolerance or {}), serial_rows, split_row, doc)
    _OPS[name] = declared
    return declared


def capture(op_name: str, variant: str = "default", *, state: Iterable[str] = (),
            mutates: Iterable[str] = (), outputs: Iterable[str] = (),
            backends: Iterable[str] = BACKENDS) -> Callable[[Callable], Variant]:
    """Decorator recording each call of any function as variant `variant` of `op_name`.

    The op is declared (by the decorated function's module) if nobody has declared it.
    """
    state, mutates, outputs = tuple(state), tuple(mutates), tuple(outputs)

    def register(fn: Callable) -> Variant:
        found = _OPS.get(op_name)
        if found is None:
            found = op(op_name, state=state, mutates=mutates, outputs=outputs, provider=fn.__module__)
        elif (state, mutates, outputs) != (found.state, found.mutates, found.outputs) and (state or mutates or outputs):
            raise RegistryError(f"op '{op_name}' is declared with state={found.state}, mutates={found.mutates}, "
                                f"outputs={found.outputs}; capture of '{fn.__qualname__}' asks for "
                                f"state={state}, mutates={mutates}, outputs={outputs}")
        return found.variant(variant, backends=backends)(fn)
    return register


def get_op(name: str) -> Op:
    found = _OPS.get(name)
    if found is None:
        raise RegistryError(f"unknown op '{name}' (registered: {', '.join(sorted(_OPS)) or 'none'})")
    return found


def all_ops() -> dict[str, Op]:
    return dict(_OPS)


def load_provider(module: str, code_dir: str | Path | None = None) -> None:
    """Import the module that declares an op; with `code_dir`, from that tree first.

    Only `module`'s top-level package is taken from `code_dir` (any copy already
    imported from elsewhere is dropped), so the harness itself stays this one.
    """
    if code_dir is not None:
        root = str(Path(code_dir).resolve())
        top = module.split(".")[0]
        if root not in sys.path:
            sys.path.insert(0, root)
        loaded = sys.modules.get(top)
        origin = getattr(loaded, "__file__", None) or ""
        if loaded is not None and not origin.startswith(root):
            for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                del sys.modules[name]
    try:
        importlib.import_module(module)
    except Exception as exc:  # any failure of the code under test makes it untestable
        raise ProviderImportError(f"provider module '{module}' failed to import: "
                                  f"{type(exc).__name__}: {exc}") from exc
