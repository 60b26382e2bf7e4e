"""Values in messages tell apart what differs: round-trip digits, and the element's ULP distance."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.compare import compare, format_value
from replay.engine.report import Check, CheckKind

finite_float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(finite_float32)
def test_a_float32_prints_as_the_shortest_text_that_reads_back_as_itself(value: float) -> None:
    text = format_value(value, "float32")
    assert np.float32(text) == np.float32(value)
    with np.errstate(over="ignore"):  # the largest float32 steps to inf
        neighbour = float(np.nextafter(np.float32(value), np.float32(np.inf)))
    if math.isfinite(neighbour):
        assert format_value(neighbour, "float32") != text


@settings(deadline=None)  # its first example pays for torch's first conversions
@given(st.floats(width=16, allow_nan=False, allow_infinity=False), st.sampled_from([torch.bfloat16, torch.float16]))
def test_a_16_bit_float_prints_exactly(value: float, dtype: torch.dtype) -> None:
    held = float(torch.tensor(value).to(dtype))
    assert float(format_value(held, str(dtype).removeprefix("torch."))) == held


def test_16_bit_floats_print_every_digit() -> None:
    assert format_value(2.0 ** -24, "float16") == "5.9604644775390625e-8"  # repr would round it to 16 digits
    assert format_value(1.0078125, "bfloat16") == "1.0078125" and format_value(-3.0, "bfloat16") == "-3"


def test_integers_print_as_integers() -> None:
    assert format_value(3.0, "int32") == "3" and format_value(-1.0, "int64") == "-1"


def test_neighbouring_float32_values_differ_in_the_message_with_their_ulp_distance() -> None:
    expected = torch.tensor([1.0, -0.686492, 2.0, 4.0])
    actual = expected.clone()
    actual[1] = torch.nextafter(expected[1], torch.tensor(0.0))  # prints the same with 6 digits
    actual[3] = expected[3] * (1 + 2 ** -20)  # 8 ulps away
    check = Check(CheckKind.VS_GOLDEN, "batched", "recorded", "out", False, compare(actual, expected, None, 0))
    text = check.describe()
    assert "first at [1]: -0.68649197 vs -0.686492 (1 ulp; max 8 ulp)" in text, text


def test_mixed_dtypes_print_both_values_in_full() -> None:
    c = compare(torch.tensor([1.0 + 2 ** -7], dtype=torch.bfloat16), torch.tensor([1.0], dtype=torch.float64),
                None, same_dtype=False)
    assert c.first_difference() == "first at [0]: 1.0078125 vs 1.0"
