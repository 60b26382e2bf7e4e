"""A call's arguments by name, as `Signature.bind` and `apply_defaults` give them, at what a
recorded or checked call can afford: those two cost ~10-14 us a call on an H200 host, a
verifier's check's largest step after its copies. A signature whose parameters are all named
(no `*args`, `**kwargs` or positional-only ones) binds a call that passes them positionally and
by name here, with a dict and a loop; any other signature or call (a missing argument, a name it
does not take: an error to say) goes to `Signature.bind`.
"""
from __future__ import annotations

import inspect
from typing import Any

BINDERS = 4096  # binders kept; past it they are made again (a program wrapping functions without end)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class Binder:
    """Binds calls of one signature: `arguments(args, kwargs)` is {name: value} in the parameters'
    order, every parameter present (its default where the call left it out)."""

    def __init__(self, signature: inspect.Signature) -> None:
        parameters = list(signature.parameters.values())
        self.signature = signature
        # None: bound by Signature.bind alone
        self._names = tuple(p.name for p in parameters) if all(p.kind in _NAMED for p in parameters) else None
        self._positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)
        self._defaults = {p.name: p.default for p in parameters if p.default is not p.empty}

    def arguments(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        names = self._names
        if names is None or len(args) > self._positional:
            return self._bound(args, kwargs)
        if not kwargs and len(args) == len(names):  # the common case: every argument by position
            return dict(zip(names, args))
        arguments = dict(zip(names, args))
        taken = 0  # keyword arguments used: any other is a name the signature does not take
        for name in names[len(args):]:
            if name in kwargs:
                arguments[name] = kwargs[name]
                taken += 1
            elif name in self._defaults:
                arguments[name] = self._defaults[name]
            else:
                return self._bound(args, kwargs)  # missing: Signature.bind says so
        return arguments if taken == len(kwargs) else self._bound(args, kwargs)

    def _bound(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


# by the signature's id (hashing a Signature hashes its parameters, at every call): a binder whose
# signature is not the one asked about (an id used again) is made anew
_binders: dict[int, Binder] = {}


def arguments(signature: inspect.Signature, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`signature`'s binding of a call (Binder.arguments), its Binder made at its first call."""
    binder = _binders.get(id(signature))
    if binder is None or binder.signature is not signature:
        if len(_binders) >= BINDERS:
            _binders.clear()
        binder = _binders[id(signature)] = Binder(signature)
    return binder.arguments(args, kwargs)
