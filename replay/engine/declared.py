"""A recorded call of a plain function that `replay.verify` gave a reference, replayed where the
trusted code does not declare its op (the function was decorated in a script, not in its own
module): the op is declared again from what the call recorded, its header's `declared` (the
function's and the reference's 'module:qualname', the tolerance and the metric). Each module is
imported under the provider trust rule (replay/code.py): a snapshot names the code, the user
trusts it."""
from __future__ import annotations

import sys
from typing import Any, Callable

from replay.code import KernelCode
from replay.errors import ReplayError
from replay.registry import Op, op_of_function
from replay.snapshot import CallRecord
from replay.tolerance import Tolerance


class NotInCode(ReplayError):
    """The function or reference a call names is not in this code: the call is untestable (exit 125)."""


def declare_again(code: KernelCode, record: CallRecord, where: str) -> Op:
    """The op of `record` (which has `declared`), declared from the function and reference it names."""
    assert record.declared is not None and record.provider is not None
    declared = record.declared
    tolerance = declared.get("tolerance")
    return op_of_function(record.op, record.provider, _resolve(code, declared["function"], where),
                          _resolve(code, declared["reference"], where),
                          Tolerance(rtol=tolerance["rtol"], atol=tolerance["atol"]) if tolerance else None,
                          declared.get("metric"), dict(declared))


def _resolve(code: KernelCode, path: str, where: str) -> Callable[..., Any]:
    """The function at 'module:qualname', its module imported if trusted (UntrustedProviderError if
    not), and defined there under that name: a path through the module's imports or attributes
    (`pkg.mod:os.system`) names nothing the user trusted."""
    module, _, qualname = path.partition(":")
    code.import_provider(module, where)
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None) if not part.startswith("__") else None
    if not (callable(found) and getattr(found, "__module__", None) == module
            and getattr(found, "__qualname__", None) == qualname):
        raise NotInCode(f"{where}: no function '{path}' (defined in that module), which replay.verify checked "
                        "this call of, is in this code")
    return found
