"""Round trips: tensors of every dtype and view, and JSON arguments, read back bit-identical."""
from __future__ import annotations

import json
import math
import tempfile
from typing import Any

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replay
from fixtures.bitwise import assert_same_view, assert_zero_before_offset
from replay.errors import CaptureError
from replay.snapshot import Snapshot, callfile
from replay.snapshot.tensors import DTYPES, OFFSET_ALIGN, Geometry, geometry_of, storage_span

REQUIRED_DTYPES = {torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
                   torch.int32, torch.int64, torch.uint8, torch.bool}
REQUIRED_DTYPES |= {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
ALL_DTYPES = sorted(DTYPES.values(), key=str)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@replay.capture("roundtrip_identity")
def identity(x: torch.Tensor, value: Any = None) -> torch.Tensor:
    return x


def random_tensor(data: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor of `shape` whose elements are the raw bytes `data` (any bit pattern, NaNs included)."""
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    if dtype is torch.bool:
        return (raw & 1).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def make_view(base: torch.Tensor, kind: str, at: int) -> torch.Tensor:
    """A view of `base`: transposed, offset slices, a step slice, a stride-0 broadcast or a 0-d element."""
    flat = base.reshape(-1)
    if kind == "transpose" and base.dim() >= 2:
        return base.transpose(0, -1)
    if kind == "row_slice" and base.dim() >= 2 and base.shape[1] > 0:
        return base[:, 1:]  # a padded row slice: storage offset 1, not contiguous
    if kind == "tail" and flat.numel():
        return flat[at % flat.numel():]
    if kind == "step":
        return flat[::2]
    if kind == "expand":
        return base.unsqueeze(0).expand(3, *base.shape)
    if kind == "element" and flat.numel():
        return flat[at % flat.numel()]  # 0-d, with a storage offset
    return base


def record_and_read(tensor: torch.Tensor, directory: str, **options: Any) -> torch.Tensor:
    """`tensor` recorded as the input and output of one call; the input read back, checked as the
    output is: the same view, bit for bit (a far offset as docs/FORMAT.md says it is rebuilt)."""
    with replay.recording(directory, **options):
        identity(tensor)
    record = Snapshot(directory).load(0)
    for key in ("in/x", "out/out"):
        assert record.recorded_offsets[key] == tensor.storage_offset()
        assert_same_view(record.tensors[key], rebuilt_offset(tensor))
    return record.tensors["in/x"]


def rebuilt_offset(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a reader rebuilds it: an offset past the stored span kept only modulo
    OFFSET_ALIGN bytes (docs/FORMAT.md), the span, strides and elements as they are."""
    geometry = geometry_of(tensor)
    offset = tensor.storage_offset()
    if offset <= geometry.span:
        return tensor
    near = offset % max(1, OFFSET_ALIGN // tensor.element_size())
    base = torch.zeros(near + geometry.span, dtype=tensor.dtype)
    base[near:] = storage_span(tensor, geometry)
    return torch.as_strided(base, tensor.shape, tensor.stride(), near)


@st.composite
def tensor_views(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(ALL_DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    size = math.prod(shape) * (1 if dtype is torch.bool else torch.empty(0, dtype=dtype).element_size())
    base = random_tensor(draw(st.binary(min_size=size, max_size=size)), dtype, shape)
    view = base
    for kind in draw(st.lists(st.sampled_from(["transpose", "row_slice", "tail", "step", "expand", "element"]),
                              max_size=2)):
        view = make_view(view, kind, draw(st.integers(0, 100)))
    return view


@SETTINGS
@given(tensor=tensor_views(), as_blob=st.booleans())
def test_any_view_round_trips_bit_identical(tensor: torch.Tensor, as_blob: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        read = record_and_read(tensor, f"{tmp}/snap", blob_threshold=0 if as_blob else 1 << 30)
        assert_zero_before_offset(read)
        if as_blob:
            assert Snapshot(f"{tmp}/snap").load(0).blobs.keys() == {"in/x"}


def test_every_required_dtype_is_supported() -> None:
    assert REQUIRED_DTYPES <= set(DTYPES.values())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["contiguous", "transpose", "row_slice", "expand", "element", "empty"])
def test_each_dtype_and_view_round_trips(dtype: torch.dtype, kind: str, tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    size = 5 * 6 * (1 if dtype is torch.bool else torch.empty(0, dtype=dtype).element_size())
    base = random_tensor(torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen).numpy().tobytes(),
                         dtype, [5, 6])
    tensor = base[:, 6:] if kind == "empty" else make_view(base, kind, 7)
    read = record_and_read(tensor, str(tmp_path / "snap"))
    assert_zero_before_offset(read)


json_scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.text(max_size=8)
                | st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(
    json_scalars,
    lambda inner: (st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(st.text(max_size=5).filter(lambda k: not k.startswith("$")), inner, max_size=3)),
    max_leaves=12)


def same_json(a: Any, b: Any) -> bool:
    """Equal values of equal types; NaN equals NaN and -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return a == b


@SETTINGS
@given(value=json_values)
def test_json_arguments_round_trip(value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with replay.recording(f"{tmp}/snap"):
            identity(torch.zeros(1), value=value)
        assert same_json(Snapshot(f"{tmp}/snap").load(0).arguments()["value"], value)


@replay.capture("roundtrip_returns_json")
def returns_scalars(x: torch.Tensor) -> tuple:
    return x + 1, float("-inf"), (1, "a")


@SETTINGS
@given(tensors=st.dictionaries(st.text(min_size=1, max_size=6), tensor_views(), max_size=5),
       header=st.none() | st.dictionaries(st.text(max_size=4), st.integers() | st.text(), max_size=3))
def test_call_files_hold_the_bytes_safetensors_writes(tensors: dict[str, torch.Tensor], header: Any) -> None:
    """Call and blob files are written from the tensors' memory, not through safetensors.torch.save:
    the bytes are the same, so a blob's digest is what any writer of the format gives it."""
    spans = {name: t.contiguous() for name, t in tensors.items()}
    metadata = {callfile.META_KEY: json.dumps(header)} if header is not None else None
    written = b"".join(bytes(part) for part in callfile.serialize_parts(metadata, spans))
    assert written == safetensors.torch.save(spans, metadata=metadata)


def test_non_tensor_outputs_are_recorded_as_json(tmp_path) -> None:
    with replay.recording(tmp_path / "snap"):
        returns_scalars(torch.zeros(2))
    record = Snapshot(tmp_path / "snap").load(0)
    assert torch.equal(record.tensors["out/out0"], torch.ones(2))
    assert record.returns_json == {"out1": {"$float": "-inf"}, "out2": {"$tuple": [1, "a"]}}


@pytest.mark.parametrize("value, problem", [({"$float": 1}, "dict key '$float'"), ({1: 2}, "dict key 1"),
                                            ([object()], "value of type object")])
def test_json_values_that_cannot_round_trip_are_capture_errors(value: Any, problem: str, tmp_path) -> None:
    with replay.recording(tmp_path / "snap", strict=True):
        with pytest.raises(CaptureError, match="op 'roundtrip_identity': argument 'value'") as err:
            identity(torch.zeros(1), value=value)
    assert problem in str(err.value)


@given(shape=st.lists(st.integers(0, 5), max_size=4), strides=st.lists(st.integers(0, 7), min_size=4, max_size=4),
       offset=st.integers(0, 9))
def test_a_geometry_spans_exactly_the_storage_elements_its_view_reaches(shape: list[int], strides: list[int],
                                                                        offset: int) -> None:
    stride = tuple(strides[:len(shape)])
    storage = torch.arange(offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n), dtype=torch.int64)
    view = torch.as_strided(storage, tuple(shape), stride, offset)
    geometry = geometry_of(view)
    reached = int(view.max()) - offset + 1 if view.numel() else 0  # the elements run from the first one's
    assert geometry.span == reached and storage_span(view, geometry).numel() == reached
    assert geometry == Geometry(geometry.dtype, geometry.shape, geometry.stride, geometry.storage_offset)
