"""What a PyTorch operator takes, writes and returns, read from its schema, and the argument
values JSON has no form for (a dtype, a device), written as text and made again."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

# the values an operator takes that JSON cannot hold, by their text: made again by `typed`
_MAKERS = {"dtype": lambda text: getattr(torch, text.removeprefix("torch.")),
           "device": torch.device,
           "layout": lambda text: getattr(torch, text.removeprefix("torch.")),
           "memory_format": lambda text: getattr(torch, text.removeprefix("torch."))}
# what these return is memory as it was found: nothing to compare a rerun with
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
_KINDS = ((torch.dtype, "dtype"), (torch.device, "device"), (torch.layout, "layout"),
          (torch.memory_format, "memory_format"))


@dataclass(frozen=True)
class OpSchema:
    name: str  # "aten.add.Tensor": namespace, operator, overload
    signature: inspect.Signature  # its arguments by their schema names
    mutates: tuple[str, ...]  # arguments it writes (in place, or out=)
    write_only: tuple[str, ...]  # of those, the out= buffers: what they held before is no input
    returns_alias: bool  # what it returns is an argument it wrote: not stored twice
    recordable: bool  # not a view, an alias, a factory or a random draw
    provider: str | None  # the module that defined it, for a custom op


def schema_of(func: Any) -> OpSchema:
    schema = func._schema
    parameters, mutates, write_only = [], [], []
    for arg in schema.arguments:
        kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        parameters.append(inspect.Parameter(arg.name, kind, default=default))
        if arg.alias_info is not None and arg.alias_info.is_write:
            mutates.append(arg.name)
            if arg.is_out:
                write_only.append(arg.name)
    aliasing = [r for r in schema.returns if r.alias_info is not None]
    takes_tensor = any("Tensor" in str(arg.type) for arg in schema.arguments)
    returns_tensor = any("Tensor" in str(r.type) for r in schema.returns)
    random = torch.Tag.nondeterministic_seeded in func.tags or schema.name.split("::")[-1] in _UNINITIALISED
    view = func.is_view or any(not r.alias_info.is_write for r in aliasing)
    return OpSchema(str(func), inspect.Signature(parameters), tuple(mutates), tuple(write_only), bool(aliasing),
                    takes_tensor and returns_tensor and not random and not view, _provider_of(func))


def as_json_values(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`values` with each dtype, device, layout or memory format (alone, or in a list) as its
    text, and which arguments those are ({name: kind}); `typed` makes them again."""
    out, kinds = {}, {}
    for name, value in values.items():
        kind = _kind(value[0] if isinstance(value, (list, tuple)) and value else value)
        if kind is None:
            out[name] = value
            continue
        kinds[name] = kind
        out[name] = [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)
    return out, kinds


def typed(values: dict[str, Any], kinds: dict[str, str]) -> dict[str, Any]:
    """The values as_json_values wrote as text, made again."""
    made = dict(values)
    for name, kind in kinds.items():
        value = values[name]
        made[name] = [_made(kind, v) for v in value] if isinstance(value, list) else _made(kind, value)
    return made


def _made(kind: str, text: Any) -> Any:
    """The value of `kind` written as `text`; ValueError for text that names no such value."""
    cls = next(c for c, k in _KINDS if k == kind)
    try:
        value = _MAKERS[kind](text) if isinstance(text, str) else None
    except (AttributeError, RuntimeError, TypeError):
        value = None
    if not isinstance(value, cls):
        raise ValueError(f"{text!r} is no {kind}")
    return value


def _kind(value: Any) -> str | None:
    return next((kind for cls, kind in _KINDS if isinstance(value, cls)), None)


def split_tensor_lists(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """A list of tensors (torch.cat's `tensors`) as one argument a tensor (`tensors_0`, ...), so
    each is stored as any tensor is, and how many each list had; `joined` puts them back."""
    out, lists = {}, {}
    for name, value in values.items():
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            lists[name] = len(value)
            out.update({f"{name}_{i}": v for i, v in enumerate(value)})
        else:
            out[name] = value
    return out, lists


def joined(values: dict[str, Any], lists: dict[str, int]) -> dict[str, Any]:
    split = set(expanded(lists, lists))
    out = {name: value for name, value in values.items() if name not in split}
    out.update({name: [values[f"{name}_{i}"] for i in range(count)] for name, count in lists.items()})
    return out


def expanded(names: tuple[str, ...] | dict[str, int], lists: dict[str, int]) -> tuple[str, ...]:
    """`names` with each list among them as the names of its tensors."""
    return tuple(part for name in names
                 for part in ([f"{name}_{i}" for i in range(lists[name])] if name in lists else [name]))


def _provider_of(func: Any) -> str | None:
    """The module that defined a `torch.library.custom_op` (what a replay must import to have the
    op again); None for PyTorch's own operators, and for ops defined another way."""
    if func.namespace in ("aten", "prims", "quantized", "_c10d_functional"):
        return None
    from torch._library import custom_ops

    definition = custom_ops.OPDEFS.get(func._schema.name)
    module = getattr(getattr(definition, "_init_fn", None), "__module__", None)
    return module if module and module != "__main__" else None
