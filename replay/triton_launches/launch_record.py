"""A recorded Triton launch (a call `replay record` made) as a launch record, the form a launch
made through `replay.launch` takes inside a call (replay/launches.py): what `replay ptx` compiles
again and `replay trace` shows. Triton's signature comes again from the recorded arguments, the
constexprs' values from them too (a dtype by its name, listed in `dtypes`), warps and stages from
what the launch ran with (the compiled kernel's details where a GPU reported them, else the
options or the autotune config chosen), and each pointer parameter binds the argument of its
name. A kernel generated while the program ran (torch.compile's), defined in the program's own
script (`__main__`) or made in a function has no `module`: no import finds it, so it is shown and
never compiled again. Its constexprs' values are under `constexprs` (a record of `replay.launch`
keeps them at its top level)."""
from __future__ import annotations

from typing import Any

import torch

from replay.launches import specialisation
from replay.snapshot import CallRecord

_COMPILED = ("num_warps", "num_stages", "registers", "shared", "hash")


def launch_record(call: CallRecord) -> dict[str, Any]:
    """The launch record of `call`, a recorded Triton launch (its `triton` field set)."""
    launch = call.triton or {}
    constexprs = set(launch.get("constexprs", ()))
    arguments = call.arguments()
    ran = {**dict(launch.get("autotune") or {}), **dict(launch.get("options") or {}),
           **dict(launch.get("compiled") or {})}
    qualname = str(launch.get("qualname", ""))
    record: dict[str, Any] = {name: ran[name] for name in _COMPILED if name in ran}
    signature = {name: "constexpr" if name in constexprs else _triton_type(value) for name, value in arguments.items()}
    record.update(kernel=qualname, grid=launch.get("grid"), signature=signature,
                  # apart from the record's own keys: a kernel may call a constexpr `kernel` or `binds`;
                  # a None argument is one too
                  constexprs={name: arguments[name] for name, kind in signature.items() if kind == "constexpr"},
                  dtypes=sorted(dict(launch.get("dtypes") or {})),
                  binds={name: name for name, value in arguments.items() if isinstance(value, torch.Tensor)},
                  specialisations=_specialisations(call, arguments))
    importable = "<locals>" not in qualname and not launch.get("generated")  # a kernel made in a function
    if call.provider and call.provider != "__main__" and importable:
        record["module"] = call.provider
    return record


def _specialisations(call: CallRecord, arguments: dict[str, Any]) -> dict[str, str]:
    """What the launch specialised on (launches.specialisation): its ints' values, and the address
    each tensor argument had, from the call's memory footprint (absent there: not known aligned)."""
    recorded = call.meta.get("memory")
    memory = recorded if isinstance(recorded, dict) else {}
    keys = {a["name"]: a["tensor"] for a in call.args if "tensor" in a}
    found = {}
    for name, value in arguments.items():
        where = memory.get(keys.get(name))
        start = where.get("start") if isinstance(where, dict) else None
        key = specialisation(value, start if type(start) is int else None)
        if key is not None:
            found[name] = key
    return found


def _triton_type(value: Any) -> str | None:
    """Triton's type of an argument as it specialises one at a launch; None for a value no launch
    passes (a snapshot is untrusted input: a string, a list, an int past 64 bits), which leaves the
    record uncompiled (CompileJob.from_launch wants every type) and shown, never a traceback."""
    from triton.runtime.jit import mangle_type

    try:
        kind = mangle_type(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return kind if isinstance(kind, str) else None
