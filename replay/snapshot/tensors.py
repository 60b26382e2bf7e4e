"""How one tensor is stored: the span of storage its view reaches, plus its geometry.

safetensors holds contiguous arrays only, so a view (a transposed weight, a padded
row slice, an expanded broadcast) is stored as the flat run of storage elements it
can touch, with dtype, shape, strides and storage offset kept beside it. Reading
rebuilds the same view: same strides, same storage offset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

_DTYPE_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
]
DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n)}
DTYPE_NAMES: dict[torch.dtype, str] = {dt: n for n, dt in DTYPES.items()}


@dataclass(frozen=True)
class Geometry:
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    # storage elements from the view's first element to its last: worked out as it is made (a
    # recorded call asks it of each tensor several times; functools.cached_property takes one lock
    # for every instance on Python 3.11, which a recording's writer threads contend for)
    span: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        last = 0
        for size, stride in zip(self.shape, self.stride):
            if not size:
                last = -1
                break
            last += (size - 1) * stride
        object.__setattr__(self, "span", 1 + last)

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "stride": list(self.stride),
                "storage_offset": self.storage_offset}

    @classmethod
    def from_json(cls, obj: dict) -> "Geometry":
        return cls(str(obj["dtype"]), tuple(int(s) for s in obj["shape"]),
                   tuple(int(s) for s in obj["stride"]), int(obj["storage_offset"]))


class UnsupportedTensor(TypeError):
    """A tensor snapshot format 1 cannot hold (unknown dtype, sparse or other non-strided layout)."""


def geometry_of(t: torch.Tensor) -> Geometry:
    if t.layout != torch.strided:
        raise UnsupportedTensor(f"layout {t.layout} is not supported by snapshot format 1 (strided only)")
    if t.dtype not in DTYPE_NAMES:
        raise UnsupportedTensor(f"dtype {t.dtype} is not supported by snapshot format 1")
    # torch's stubs allow a SymInt, which only symbolic tracing gives: the tensors recorded are real
    offset: int = t.storage_offset()  # type: ignore[assignment]
    return Geometry(DTYPE_NAMES[t.dtype], tuple(t.shape), tuple(t.stride()), offset)


def storage_span(t: torch.Tensor, geometry: Geometry | None = None) -> torch.Tensor:
    """A 1-D view of exactly the storage elements `t` can reach (no copy), outside autograd (a
    tensor that needs none is not detached: a recorded call does this for each of its tensors)."""
    g = geometry or geometry_of(t)
    return torch.as_strided(t.detach() if t.requires_grad else t, (g.span,), (1,), g.storage_offset)


# Reading a tensor costs memory in proportion to what is stored, whatever the geometry claims:
# a view (a broadcast, overlapping strides) may reach MAX_VIEW_RATIO times its stored bytes, or
# MIN_VIEW_LIMIT bytes; the reader also bounds the sum over a call (replay/snapshot/reader.py).
MAX_VIEW_RATIO = 64
MIN_VIEW_LIMIT = 16 << 20
# The zeros before a storage offset are made only up to the stored span's size; past that the
# rebuilt view keeps the offset modulo OFFSET_ALIGN bytes (its alignment), not its distance.
OFFSET_ALIGN = 256


def rebuild(span: torch.Tensor, g: Geometry) -> torch.Tensor:
    """Rebuild the recorded view over `span` (elements before the offset are zero)."""
    if DTYPES.get(g.dtype) != span.dtype:
        raise ValueError(f"stored dtype {span.dtype} does not match recorded dtype {g.dtype}")
    if len(g.shape) != len(g.stride):
        raise ValueError(f"shape {list(g.shape)} and stride {list(g.stride)} differ in length")
    if span.numel() != g.span:
        raise ValueError(f"stored span has {span.numel()} elements, geometry needs {g.span}")
    numel = math.prod(g.shape)
    size = span.element_size()
    if numel * size > max(MAX_VIEW_RATIO * g.span * size, MIN_VIEW_LIMIT):
        raise ValueError(f"a view of {numel} elements over {g.span} stored: more than {MAX_VIEW_RATIO} times "
                         f"what is stored; refused")
    offset = g.storage_offset
    if offset > g.span:
        offset %= max(1, OFFSET_ALIGN // size)
    if offset:
        base = torch.zeros(offset + g.span, dtype=span.dtype)
        base[offset:] = span
    else:
        base = span
    return torch.as_strided(base, g.shape, g.stride, offset)
