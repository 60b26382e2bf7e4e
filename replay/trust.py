"""Which provider modules a snapshot may make `replay` import: the trust rule.

Each call in a snapshot names the module that declares its op, and replaying imports that
module, which runs its code. A snapshot is data that may come from anywhere, so it never
chooses the code on its own: a provider is imported only if the user trusts it, because

- an installed package declares it in the `replay.providers` entry-point group (this
  project's `replay_kernels` does, in pyproject.toml);
- the user names it, `--provider MOD` (a module, or a package and its submodules);
- it is a package (a directory with __init__.py) at the top of the tree the user gave with
  `--code DIR` (`replay bisect` gives its worktrees), or a loose module (a .py file) there
  whose text declares ops (`replay.op(`, `replay.capture(`): a tree's other scripts (setup.py,
  a deployment script, the script that recorded) are not a snapshot's to run.

The harness itself (`replay`) is never a provider. Anything else is refused before any
import, with a line saying how to trust it. `python -m replay` drops the working directory
from sys.path, so a trusted name cannot be found in whatever directory replay runs from.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Iterable

from replay.errors import UntrustedProviderError

ENTRY_POINT_GROUP = "replay.providers"
HARNESS = "replay"


def declared_providers() -> frozenset[str]:
    """The modules installed packages declare in the `replay.providers` entry-point group."""
    return frozenset(ep.value.split(":")[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP))


@dataclass(frozen=True)
class ProviderTrust:
    """The modules (packages include their submodules) and the code tree a replay may import from."""

    modules: frozenset[str]
    code_dir: Path | None = None

    @classmethod
    def of(cls, named: Iterable[str] = (), code_dir: Path | None = None) -> ProviderTrust:
        """The declared providers, the ones the user named, and the modules under `code_dir`."""
        return cls(declared_providers() | frozenset(named), code_dir)

    def allows(self, module: str) -> bool:
        top = module.split(".")[0]
        if top == HARNESS:
            return False
        if any(module == m or module.startswith(m + ".") for m in self.modules):
            return True
        return self.code_dir is not None and ((self.code_dir / top / "__init__.py").is_file()
                                              or declares_ops(self.code_dir / f"{top}.py"))

    def check(self, module: str, where: str) -> None:
        """Raise UntrustedProviderError (exit 2) unless `module` may be imported."""
        if not self.allows(module):
            raise UntrustedProviderError(
                f"{where}: provider module '{module}' is not trusted, so it is not imported (a snapshot does not "
                f"choose the code replay runs); trust it with {_advice(module.split('.')[0])}, or by installing a "
                f"package that declares it in the '{ENTRY_POINT_GROUP}' entry-point group")


_DECLARES_OPS = re.compile(r"\breplay\.(op|capture)\(")
# what makes a Triton kernel of a function: a recording of a program that never imported replay names those
_TRITON_DECORATORS = frozenset({"jit", "autotune", "heuristics"})


def declares_ops(path: Path) -> bool:
    """Whether `path` is a loose module that declares ops (its text calls replay.op or replay.capture)
    or Triton kernels (a function decorated with triton.jit, triton.autotune or triton.heuristics,
    in a module that imports triton: read from its syntax, not found in a comment or a string)."""
    try:
        if not path.is_file():
            return False
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return _DECLARES_OPS.search(text) is not None or _declares_triton_kernels(text)


def _declares_triton_kernels(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    imports_triton = any(
        (isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "triton" for alias in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton")
        for node in ast.walk(tree))
    return imports_triton and any(
        _decorator_name(decorator) in _TRITON_DECORATORS
        for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for decorator in node.decorator_list)


def _decorator_name(decorator: ast.expr) -> str:
    """`jit` of `@triton.jit`, `@jit` or `@triton.autotune(...)`'s `autotune`: the last name called or used."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _advice(top: str) -> str:
    """How to trust `top`: `--code .` when it sits in the current directory, else the general forms."""
    here = Path.cwd()
    if (here / top / "__init__.py").is_file() or declares_ops(here / f"{top}.py"):
        return f"--code . (it is in the current directory) or --provider {top}"
    return f"--provider {top}, or with --code DIR for a tree holding it"
