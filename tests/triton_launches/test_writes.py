"""Which parameters a Triton kernel writes through, read from its source (replay.triton_launches.writes.py)."""
import pytest

import replay  # noqa: F401 (the interpreter, without a GPU)
from replay.triton_launches.writes import accessed_parameters

import writes_cases as cases


@pytest.mark.parametrize("kernel, written", [
    (cases.plain, {"out_ptr"}),
    (cases.through_helpers, {"out_ptr"}),  # followed into the helpers: the reading one writes nothing
    (cases.advanced_pointer, {"acc_ptr", "lock_ptr"}),  # a pointer advanced in a loop; an atomic
    (cases.block_pointer, {"out_ptr"}),  # a block pointer made from it, by position or keyword
    (cases.hands_to_unknown, {"x_ptr", "out_ptr"}),  # handed to code that cannot be read: taken as written
    (cases.indirect, {"cache_ptr", "src_ptr"}),  # through an address loaded from position_buf, not into it
])
def test_the_parameters_a_kernel_writes_through(kernel, written):
    pointers = {name for name in kernel.arg_names if name.endswith(("_ptr", "_buf"))}
    assert accessed_parameters(kernel.fn)[0] & pointers == written


def test_a_kernel_whose_source_cannot_be_read_writes_every_parameter():
    exec_globals: dict = {}
    exec("def made(a_ptr, b_ptr, n):\n    pass\n", exec_globals)  # no file to read it from
    assert accessed_parameters(exec_globals["made"]) == ({"a_ptr", "b_ptr", "n"},) * 2


@pytest.mark.parametrize("kernel, read", [
    (cases.plain, {"x_ptr"}),
    (cases.through_helpers, {"x_ptr"}),  # the helper that loads, not the one that stores
    (cases.advanced_pointer, {"x_ptr", "lock_ptr"}),  # an atomic reads what it updates
    (cases.block_pointer, {"x_ptr"}),
    (cases.hands_to_unknown, {"x_ptr"}),  # handed to code that cannot be read: it may read it
    (cases.indirect, {"src_ptr", "position_buf", "cache_ptr"}),  # the atomic reads the cache it adds into
])
def test_the_parameters_a_kernel_reads_through(kernel, read):
    pointers = {name for name in kernel.arg_names if name.endswith(("_ptr", "_buf"))}
    assert accessed_parameters(kernel.fn)[1] & pointers == read
