"""IntervalMap against a byte-by-byte model: what was painted last is what is read."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from replay.dataflow.intervals import IntervalMap

SIZE = 64
ranges = st.tuples(st.integers(0, SIZE), st.integers(0, SIZE)).map(sorted)
operations = st.lists(st.tuples(st.sampled_from(["assign", "update"]), ranges, st.integers(0, 9)), max_size=30)


def _model_pieces(model: list, start: int, end: int) -> list[tuple[int, int, object]]:
    """Runs of equal painted values in [start, end), as IntervalMap.pieces gives them (a run of one
    value may come as several pieces there: compared byte by byte)."""
    return [(i, i + 1, model[i]) for i in range(start, end) if model[i] is not None]


def _bytes(pieces: list[tuple[int, int, object]]) -> list[tuple[int, object]]:
    return [(i, value) for s, e, value in pieces for i in range(s, e)]


@settings(max_examples=200, deadline=None)
@given(operations, ranges)
def test_pieces_say_what_was_painted_last_on_every_byte(ops: list, query: list[int]) -> None:
    painted: IntervalMap[object] = IntervalMap()
    model: list = [None] * SIZE
    for kind, (start, end), value in ops:
        if kind == "assign":
            painted.assign(start, end, value)
            for i in range(start, end):
                model[i] = value
        else:
            painted.update(start, end, lambda old, v=value: (old, v))
            for i in range(start, end):
                model[i] = (model[i], value)
    start, end = query
    pieces = painted.pieces(start, end)
    assert _bytes(pieces) == _bytes(_model_pieces(model, start, end))
    assert all(s < e for s, e, _ in pieces) and all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:]))
