"""A stand-in for kernel-replay's registration API, so a kernel module written against it imports
without it: `replay repro` copies this file to `code/replay/__init__.py` beside the kernel's package.

`replay.op(...)` gives an object whose decorators (`@op.batched`, `@op.variant("x")`,
`@op.reference`, ...) keep the function by variant name (repro.py finds it there: a factory may
make variants no module attribute names) and return it; `replay.launch(kernel, grid, *args,
**kwargs)` launches; `replay.tag`, `replay.scope`, `replay.step` and everything else do nothing.
`replay.tolerance` holds the names modules import from it. Only stdlib: torch is not needed here.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Callable


class _Inert:
    """Takes any call, attribute or decorator use and does nothing; a decorated function is returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Inert()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __enter__(self) -> "_Inert":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Op:
    """An op's variants as its module registers them, by name: what repro.py calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variants: dict[str, Callable[..., Any]] = {}

    def _register(self, *names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for name in names:
                self.variants[name] = fn
            return fn
        return register

    def reference(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self._register("reference")(fn)

    def single(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self._register("single")(fn)

    def batched(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self._register("batched")(fn)

    def single_and_batched(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self._register("single", "batched")(fn)

    def variant(self, name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return self._register(name)

    def __getattr__(self, name: str) -> Any:  # contracts, examples, ...: not needed to call a variant
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


_OPS: dict[str, _Op] = {}


def op(name: str, *args: Any, **kwargs: Any) -> _Op:
    return _OPS.setdefault(name, _Op(name))


def get_op(name: str) -> _Op:
    return _OPS.setdefault(name, _Op(name))


def capture(name: str, variant: str = "default", **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return get_op(name)._register(variant)


def launch(kernel: Any, grid: Any, *args: Any, path: str | None = None, **kwargs: Any) -> Any:
    return kernel[grid](*args, **kwargs)  # `path` names the launch for kernel-replay's records: not Triton's


def tag(name: str, value: Any) -> None:
    return None


def scope(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert()


tolerance = types.ModuleType(__name__ + ".tolerance")
tolerance.__getattr__ = lambda name: _Inert()  # type: ignore[method-assign]
sys.modules[tolerance.__name__] = tolerance
