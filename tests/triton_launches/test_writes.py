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


def test_a_launch_takes_the_roles_its_own_kernel_writes_not_those_of_a_namesake() -> None:
    """Two kernels of one name and source text may call different helpers (a module reloaded after
    a helper in another file changed), so write through different parameters: each launch is
    described by its own kernel's analysis, whatever the recorder worked out for the other."""
    import torch

    from replay.recorder.options import RecordingOptions
    from replay.triton_launches.kernels import KernelInfo
    from replay.triton_launches.recording import LaunchRecorder

    recorder = LaunchRecorder(None, RecordingOptions())
    alike = dict(module="kmod", qualname="k", params=("x_ptr", "y_ptr"), defaults={}, constexprs=frozenset(),
                 source="def k(x_ptr, y_ptr): helper(x_ptr, y_ptr)", source_sha256="0" * 64, read=frozenset(),
                 generated=False, module_source=None, module_source_sha256=None)
    writes_y = KernelInfo(**alike, written=frozenset({"y_ptr"}))
    writes_x = KernelInfo(**alike, written=frozenset({"x_ptr"}))
    params = {"x_ptr": torch.zeros(2), "y_ptr": torch.zeros(2)}
    assert recorder._shape(writes_y, params).mutates == ("y_ptr",)
    assert recorder._shape(writes_x, params).mutates == ("x_ptr",)
    assert recorder._shape(writes_x, params).write_only == ("x_ptr",)
