"""Buffers kept for reuse (replay/recorder/kept.py): a take gives the buffer of its key let go
last; past the bound, those let go longest ago are dropped, never the one let go now."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from replay.recorder.kept import Kept

# few keys and sizes near the bound: a key holds several buffers when the oldest are dropped
OPERATIONS = st.lists(st.tuples(st.sampled_from(["give", "give", "take"]), st.integers(0, 2), st.integers(0, 9)),
                      max_size=40)


@settings(max_examples=300)
@given(operations=OPERATIONS, bound=st.integers(0, 20))
def test_kept_buffers_are_the_ones_let_go_last_within_the_bound(operations: list[tuple[str, int, int]],
                                                                 bound: int) -> None:
    kept: Kept[int] = Kept(bound)
    model: list[tuple[int, torch.Tensor, int]] = []  # what is kept, in the order let go
    for operation, key, nbytes in operations:
        if operation == "give":
            buffer = torch.empty(0)
            kept.give(key, buffer, nbytes)
            if 0 < bound and nbytes <= bound:
                model.append((key, buffer, nbytes))
                while sum(n for _, _, n in model) > bound:
                    model.pop(0)
        else:
            newest = next((n for n in range(len(model) - 1, -1, -1) if model[n][0] == key), None)
            expected = model.pop(newest)[1] if newest is not None else None
            assert kept.take(key) is expected
        assert kept.nbytes == sum(n for _, _, n in model) <= bound
    kept.clear()
    assert kept.nbytes == 0 and all(kept.take(key) is None for key in range(3))
