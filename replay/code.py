"""Where the kernel code a command runs comes from: one way for every command that imports it.

A user's code reaches a command three ways, each of them trusted by the user, never by a
snapshot (replay/trust.py):

- `--code DIR`: DIR goes first on the import path; its top-level packages, and its loose
  modules that declare ops or Triton kernels, are trusted (a bisect probe gives its worktree this way);
- `--provider MOD`: MOD is trusted, and found on the import path or, failing that, in the
  current directory (the console script does not put the current directory on the path);
- an installed package declaring a `replay.providers` entry point.

Snapshot replays import the provider each call names (`import_provider`). Commands given op
names (`replay ptx OP`, `replay invariance OP`) import the trusted modules that may declare them
(`ops`): the declared and named providers, the packages at the top of the code tree, and its
loose modules whose text names one of the ops (or, with no op named, registers an example): a
tree's other scripts (setup.py, a recording script) are never run to look for ops.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable

from replay.errors import ProviderImportError, RegistryError
from replay.registry import Op, all_ops, get_op
from replay.trust import ProviderTrust


class KernelCode:
    """The trusted kernel modules of one command, and the import path that finds them."""

    def __init__(self, code_dir: Path | None = None, providers: Iterable[str] = ()):
        self.code_dir = Path(code_dir).resolve() if code_dir is not None else None
        self.named = tuple(providers)
        self.trust = ProviderTrust.of(self.named, self.code_dir)
        self.loaded: set[str] = set()
        if self.code_dir is not None:
            _put_first_on_path(str(self.code_dir))
        if self.named and os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())  # after what is installed: an installed module of that name wins

    def import_provider(self, module: str, where: str) -> None:
        """Import `module`, which a snapshot names (at `where`), once: UntrustedProviderError (exit 2)
        unless it is trusted, ProviderImportError (exit 125: this code cannot be tested) if it fails."""
        if module in self.loaded:
            return
        self.trust.check(module, where)
        self._import(module)

    def ops(self, names: Iterable[str]) -> list[Op]:
        """The ops called `names`, once the trusted modules that may declare them are imported (see
        the module's docstring). With no name, every op that registers examples."""
        names = list(names)
        for module in sorted(self.trust.modules) + self._in_tree(names):
            self._import(module)
        names = names or sorted(op.name for op in all_ops().values() if op.examples)
        if not names:
            raise RegistryError("no op with examples is registered: name a provider with --provider MOD, "
                                "or give the tree that declares it with --code DIR")
        return [get_op(name) for name in names]

    def module(self, name: str) -> ModuleType:
        """Import module `name`, which the user named (trusted), from the code tree when it is there."""
        self._import(name)
        return importlib.import_module(name)  # already imported, or gone from its package: said by the caller

    def code_paths(self) -> list[Path]:
        """Where the imported providers' code is: a top-level package's directory, or a loose module's file."""
        return [source.resolve() for provider in self.loaded if (source := package_source(provider)) is not None]

    def _in_tree(self, op_names: list[str]) -> list[str]:
        """The code tree's top-level packages, and its loose modules whose text names one of
        `op_names` in quotes (with none, calls `.example(`)."""
        if self.code_dir is None:
            return []
        needles = [f'"{name}"' for name in op_names] + [f"'{name}'" for name in op_names] or [".example("]
        found = []
        for path in sorted(self.code_dir.iterdir()):
            if path.is_dir() and path.name.isidentifier() and (path / "__init__.py").is_file():
                found.append(path.name)
            elif path.suffix == ".py" and path.stem.isidentifier() and self.trust.allows(path.stem) \
                    and _mentions(path, needles):
                found.append(path.stem)
        return found

    def _import(self, module: str) -> None:
        """Import `module` from the code tree when it is there (a copy imported from elsewhere is
        dropped first, so that the tree's own code runs). A module gone from a package that imports
        fine (renamed or merged since a snapshot was recorded) is no error: the package may
        register the op itself."""
        top = module.split(".")[0]
        if self.code_dir is not None and _is_in_tree(self.code_dir, top):
            loaded = sys.modules.get(top)
            origin = getattr(loaded, "__file__", None) or ""
            if loaded is not None and not origin.startswith(str(self.code_dir) + os.sep):
                for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                    del sys.modules[name]
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:  # any failure of the code under test makes it untestable
            missing = isinstance(exc, ModuleNotFoundError) and exc.name
            if missing == module and "." in module:
                self.loaded.add(module)
                return
            raise ProviderImportError(f"provider module '{module}' failed to import: "
                                      f"{type(exc).__name__}: {exc}{self._where_to_look(missing or '')}") from exc
        self.loaded.add(module)

    def _where_to_look(self, missing: str) -> str:
        """For a module found nowhere: where it was looked for, and what to add."""
        if not missing or "." in missing:
            return ""
        looked = ["the import path", f"the current directory ({os.getcwd()})" if self.named else None,
                  f"--code {self.code_dir}" if self.code_dir is not None else None]
        return (f" (looked in {', '.join(w for w in looked if w)}; give --code DIR for the tree that holds "
                f"'{missing}', or install it)")


def _mentions(path: Path, needles: list[str]) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return any(needle in text for needle in needles)


def _put_first_on_path(root: str) -> None:
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)


def _is_in_tree(root: Path, top: str) -> bool:
    return (root / top / "__init__.py").is_file() or (root / f"{top}.py").is_file()


def package_source(module: str) -> Path | None:
    """Where the code of the top-level package (or loose module) `module` belongs to lives, as
    imported in this process: the package's directory, the module's file; None when not on disk."""
    found = sys.modules.get(module.partition(".")[0])
    places = list(getattr(found, "__path__", []) or [])
    file = getattr(found, "__file__", None)
    source = Path(places[0]) if places else Path(file) if file else None
    return source if source is not None and source.exists() else None
