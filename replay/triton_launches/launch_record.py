"""A recorded Triton launch (a call `replay record` made) as a launch record, the form a launch
made through `replay.launch` takes inside a call (replay/launches.py): what `replay ptx` compiles
again and `replay trace` shows. Triton's signature comes again from the recorded arguments, the
constexprs' values from them too (a dtype by its name, listed in `dtypes`), warps and stages from
what the launch ran with (the compiled kernel's details where a GPU reported them, else the
options or the autotune config chosen), and each pointer parameter binds the argument of its
name. A kernel generated while the program ran (torch.compile's) or defined in the program's own
script (`__main__`) has no `module`: no import finds it, so it is shown and never compiled again."""
from __future__ import annotations

from typing import Any

import torch

from replay.snapshot import CallRecord

_COMPILED = ("num_warps", "num_stages", "registers", "shared", "hash")


def launch_record(call: CallRecord) -> dict[str, Any]:
    """The launch record of `call`, a recorded Triton launch (its `triton` field set)."""
    from triton.runtime.jit import mangle_type

    launch = call.triton or {}
    constexprs = set(launch.get("constexprs", ()))
    arguments = call.arguments()
    ran = {**dict(launch.get("autotune") or {}), **dict(launch.get("options") or {}),
           **dict(launch.get("compiled") or {})}
    record: dict[str, Any] = {name: arguments[name] for name in constexprs if name in arguments}
    record.update({name: ran[name] for name in _COMPILED if name in ran})
    record.update(kernel=launch.get("qualname"), grid=launch.get("grid"),
                  signature={name: "constexpr" if name in constexprs else mangle_type(value)
                             for name, value in arguments.items()},
                  dtypes=sorted(dict(launch.get("dtypes") or {})),
                  binds={name: name for name, value in arguments.items() if isinstance(value, torch.Tensor)})
    if call.provider and call.provider != "__main__" and not launch.get("generated"):
        record["module"] = call.provider
    return record
