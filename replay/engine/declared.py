"""A recorded call of an op declared where a function was decorated (`replay.capture`, or
`replay.verify` given a reference), replayed where the trusted code does not declare it (the
decorator ran in a script, not in the function's module): the op is declared again from what the
call recorded, its header's `declared` (each variant's 'module:qualname', state, mutates,
outputs, tolerance and metric). Each module is imported under the provider trust rule
(replay/code.py): a snapshot names the code, the user trusts it."""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

from replay.code import KernelCode
from replay.errors import ReplayError
from replay.registry import Op, declared_op
from replay.snapshot import CallRecord


class NotInCode(ReplayError):
    """The function or reference a call names is not in this code: the call is untestable (exit 125)."""


def declare_again(code: KernelCode, record: CallRecord, where: str) -> Op:
    """The op of `record` (which has `declared`), declared from the functions it names."""
    assert record.declared is not None and record.provider is not None
    functions = {variant: _resolve(code, path, where) for variant, path in record.declared["variants"].items()}
    return declared_op(record.op, record.provider, record.declared, functions)


def _resolve(code: KernelCode, path: str, where: str) -> Callable[..., Any]:
    """The function at 'module:qualname', its module imported if trusted (UntrustedProviderError if
    not), and defined there under that name. The path is walked through the module's and its
    classes' own dictionaries, never through getattr (a module's `__getattr__` could import what
    nobody trusted), and reaches no further: not a module it imported, nor a class or function
    defined elsewhere (`pkg.mod:os.system`, `pkg.mod:numpy.f2py.x` name nothing)."""
    module, _, qualname = path.partition(":")
    code.import_provider(module, where)
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        scope = found
        found = vars(scope).get(part) if (scope is sys.modules.get(module) or inspect.isclass(scope)) \
            and not part.startswith("__") else None
        if isinstance(found, staticmethod):
            found = found.__func__
        if found is None or getattr(found, "__module__", None) != module:
            break
    if not (inspect.isfunction(found) and found.__module__ == module and found.__qualname__ == qualname):
        raise NotInCode(f"{where}: no function '{path}' (defined in that module), which the call's op was "
                        "declared with, is in this code")
    return found
