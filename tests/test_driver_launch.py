"""The tool's own kernels launched through the CUDA driver with the interpreter lock kept
(replay/driver_launch.py): the parameters the driver is handed are the ones Triton's launcher
hands it, a kernel that needs more than a plain launch is left to Triton, and on a GPU the
results match Triton's launch and no other thread runs meanwhile."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from replay import direct_launch, driver_launch
from replay.recorder import unchanged_bits
from replay.snapshot import unwritten


class FakeDriver:
    """A driver whose kernels take parameters of `sizes`; launches are kept, their values read back."""

    def __init__(self, sizes: list[int], code: int = 0):
        self.sizes, self.code = sizes, code
        self.launches: list[tuple[tuple[Any, ...], list[int]]] = []

    def parameter_sizes(self, function: int) -> list[int]:
        return self.sizes

    def launch_kernel(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                      stream: int, parameters: Any, extra: Any) -> int:
        kinds = {4: ctypes.c_int32, 8: ctypes.c_int64}
        values = [kinds[size].from_address(parameters[n]).value for n, size in enumerate(self.sizes)]
        self.launches.append(((function, gx, gy, gz, bx, by, bz, shared, stream), values))
        return self.code


def compiled(**metadata: Any) -> SimpleNamespace:
    plain = dict(num_warps=4, shared=1024, num_ctas=1, global_scratch_size=0, profile_scratch_size=0)
    return SimpleNamespace(function=0xF00, metadata=SimpleNamespace(**{**plain, **metadata}))


def test_a_launch_hands_the_driver_each_argument_at_its_width_then_null_scratch_pointers() -> None:
    driver = FakeDriver([8, 4, 8, 8, 8])  # a pointer, an i32, an i64, then two scratch pointers
    tensor = torch.arange(4)
    arguments = (tensor, -7, 1 << 40)
    launch = driver_launch.prepare(compiled(), arguments, driver)  # type: ignore[arg-type]
    assert launch is not None
    launch((3, 2, 1), 0xABC, (tensor, 12345, -(1 << 33)))
    (config, values), = driver.launches
    assert config == (0xF00, 3, 2, 1, 128, 1, 1, 1024, 0xABC)
    assert values == [tensor.data_ptr(), 12345, -(1 << 33), 0, 0]


@pytest.mark.parametrize("why, metadata, sizes, arguments", [
    ("scratch memory", dict(global_scratch_size=64), [8, 8, 8], (1,)),
    ("a cluster", dict(num_ctas=2), [4, 8, 8], (1,)),
    ("a cooperative launch", dict(launch_cooperative_grid=True), [4, 8, 8], (1,)),
    ("an i64 where the argument is 32-bit", {}, [8, 8, 8], (1,)),
    ("more parameters than arguments and scratch", {}, [4, 4, 8, 8], (1,)),
    ("a float argument", {}, [4, 8, 8], (1.5,)),
    ("a driver that cannot say", {}, [], (1,)),
])
def test_a_kernel_that_needs_more_than_a_plain_launch_is_left_to_triton(why: str, metadata: dict[str, Any],
                                                                        sizes: list[int], arguments: tuple) -> None:
    driver: Any = FakeDriver(sizes)
    assert driver_launch.prepare(compiled(**metadata), arguments, driver) is None, why


def test_a_launch_the_driver_refuses_is_raised_as_refused_and_an_empty_grid_launches_nothing() -> None:
    driver: Any = FakeDriver([4], code=1)
    launch = driver_launch.prepare(compiled(), (1,), driver)
    assert launch is not None
    with pytest.raises(driver_launch.Refused) as refused:
        launch((1, 1, 1), 0, (1,))
    assert refused.value.for_good  # a bad value: every later launch would be refused too
    assert not driver_launch.Refused(201).for_good  # no context current on this thread: this launch alone
    launch((0, 1, 1), 0, (1,))
    launch((4, 1, 0), 0, (1,))
    assert len(driver.launches) == 1  # as Triton's launcher: nothing queued for an empty grid


@pytest.mark.gpu
def test_on_a_gpu_the_driver_launches_what_triton_launches_and_keeps_the_interpreter_lock() -> None:
    assert driver_launch.loaded() is not None, "a GPU machine's driver says a kernel's parameters (CUDA 12.4 on)"
    gen = torch.Generator().manual_seed(5)
    before = torch.randint(-9, 9, (50000,), generator=gen, dtype=torch.int32).cuda()
    after = before.clone()
    after[::7] += 1
    launcher = unchanged_bits._LAUNCHERS[4]
    made = [unchanged_bits.unchanged_mask(before, after, after.numel()) for _ in range(2)]  # the first may compile
    variant = (torch.cuda.current_device(), direct_launch._widths((before.data_ptr(), after.data_ptr(),
                                                                    made[0].data_ptr(), after.numel())))
    assert launcher.through_driver[variant] is not None
    expected = unwritten.unchanged_mask(before, after)
    assert all(torch.equal(m, expected) for m in made)

    # the driver's entry point is called the way ctypes.PyDLL calls: the interpreter lock kept
    prepared = launcher.through_driver[variant]
    keeping = ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
    assert prepared is not None and prepared._driver.launch_kernel._flags_ & keeping
    launched: list[int] = []
    real = prepared._driver.launch_kernel

    class Counting:
        def launch_kernel(self, *arguments: Any) -> int:
            launched.append(arguments[0])
            return real(*arguments)
    mask = torch.empty_like(made[0])
    prepared._driver = Counting()  # type: ignore[assignment]
    try:
        launcher.launch(before.device, (7, 1, 1), before.data_ptr(), after.data_ptr(), mask.data_ptr(), after.numel())
    finally:
        prepared._driver = driver_launch.loaded()  # type: ignore[assignment]
    torch.cuda.synchronize()
    assert len(launched) == 1 and torch.equal(mask, expected)
