"""Run something on a module once it is imported, without importing it first.

The door must reach torch.compile's launcher class (torch._inductor.runtime.triton_heuristics),
but importing that module costs a second at the start of every recorded program, most of which
never compile anything. So the door patches it when the program itself first imports it: a
finder at the head of sys.meta_path hands the import to the finders after it and runs the
callback once the module has executed.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Callable, Sequence


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # a module is imported once
        for finder in sys.meta_path:
            if not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.then)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[ModuleType], None]):
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:  # the module's own loader, as if nobody had watched
            module.__spec__.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: the real loader's
        return getattr(self.loader, name)


def when_imported(name: str, then: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Call `then(module)` now if `name` is imported, else right after the program imports it.
    Returns a function that stops watching (nothing to do once it has run)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return lambda: None
    watcher = _AfterImport(name, then)
    sys.meta_path.insert(0, watcher)

    def stop() -> None:
        if watcher in sys.meta_path:  # not yet imported
            sys.meta_path.remove(watcher)
    return stop
