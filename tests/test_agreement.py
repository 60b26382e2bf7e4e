"""compare.agreement (the verifier's verdict computed on the device, one flag read back) passes
exactly where compare passes: any values, NaNs and infinities included, any tolerance, across
element types."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings, strategies as st

from replay.compare import agreement, compare
from replay.tolerance import Tolerance

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-3, math.inf, -math.inf, math.nan, 3.5, 65504.0]
values = st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-1e6, 1e6, width=32)), min_size=1, max_size=12)
tolerances = st.one_of(st.none(), st.builds(Tolerance, rtol=st.sampled_from([0.0, 1e-3, 0.1]),
                                            atol=st.sampled_from([0.0, 1e-5, 1.0])))
dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32])


@settings(max_examples=300, deadline=None)
@given(values, st.data(), tolerances, dtypes, dtypes)
def test_agreement_passes_where_compare_passes(actual: list[float], data: st.DataObject,
                                               tolerance: Tolerance | None, actual_dtype: torch.dtype,
                                               expected_dtype: torch.dtype) -> None:
    nudges = data.draw(st.lists(st.sampled_from([0.0, 0.0, 1e-4, -0.5, math.nan, math.inf]),
                                min_size=len(actual), max_size=len(actual)))
    a = torch.tensor(actual, dtype=torch.float64)
    e = a + torch.tensor(nudges, dtype=torch.float64)
    if not actual_dtype.is_floating_point:
        a = torch.nan_to_num(a, nan=0.0, posinf=7.0, neginf=-7.0).clamp(-1e6, 1e6)
    if not expected_dtype.is_floating_point:
        e = torch.nan_to_num(e, nan=0.0, posinf=7.0, neginf=-7.0).clamp(-1e6, 1e6)
    a, e = a.to(actual_dtype), e.to(expected_dtype)
    verdict = agreement(a, e, tolerance)
    assert verdict is not None and bool(verdict) == compare(a, e, tolerance, same_dtype=False).passed


def test_shapes_that_differ_are_left_to_compare() -> None:
    assert agreement(torch.zeros(2), torch.zeros(3), None) is None
