"""A call's binding (replay/binding.py, what the recorder and the verifier bind calls with) against
Signature.bind."""
from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings, strategies as st

from replay import binding


def plain(x, w, bias=None, scale=1.0, *, eps=1e-5, mode="a"):
    return x


def required_keyword(x, *, positions):
    return x


def starred(x, *rest, **options):
    return x


def positional_only(x, /, w, bias=None):
    return x


SIGNATURES = [inspect.signature(fn) for fn in (plain, required_keyword, starred, positional_only)]
NAMES = ["x", "w", "bias", "scale", "eps", "mode", "positions", "other"]


def reference(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict | type:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return TypeError
    bound.apply_defaults()
    return dict(bound.arguments)


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(SIGNATURES) - 1), positional=st.integers(0, 6),
       keywords=st.lists(st.sampled_from(NAMES), unique=True, max_size=5))
def test_binds_as_signature_bind(which: int, positional: int, keywords: list[str]) -> None:
    signature = SIGNATURES[which]
    args = tuple(f"arg{i}" for i in range(positional))
    kwargs = {name: f"kw_{name}" for name in keywords}
    want = reference(signature, args, kwargs)
    if want is TypeError:
        with pytest.raises(TypeError):
            binding.arguments(signature, args, kwargs)
        return
    got = binding.arguments(signature, args, kwargs)
    assert got == want
    assert list(got) == list(want)  # in the parameters' order: a check's kind is read in it


def test_every_argument_present_with_its_default() -> None:
    got = binding.arguments(SIGNATURES[0], ("x", "w"), {"mode": "b"})
    assert got == {"x": "x", "w": "w", "bias": None, "scale": 1.0, "eps": 1e-5, "mode": "b"}


def test_a_signature_made_again_at_the_same_id_is_bound_by_its_own_parameters() -> None:
    first = inspect.signature(plain)
    assert list(binding.arguments(first, ("x", "w"), {})) == ["x", "w", "bias", "scale", "eps", "mode"]
    other = inspect.signature(required_keyword)
    binding._binders[id(other)] = binding.Binder(first)  # as if `other` were made where a dead one was
    assert binding.arguments(other, ("x",), {"positions": 3}) == {"x": "x", "positions": 3}
