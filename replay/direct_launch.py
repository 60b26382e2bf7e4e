"""The tool's own Triton kernels launched through their compiled launcher, past Triton's launch path.

Triton's own launch (binding, specialisation key, cache lookup, hooks) costs a launch two to five
times what the launch itself does: 30 us against 16 us on the H100 host alone, 55-90 us against
~15 us inside a recording (docs/PERFORMANCE.md). A kernel the tool launches many times with
arguments of one kind (a pinned table's address, a few ints) is launched through Triton once on
each device, which compiles it; later launches call the compiled kernel's launcher directly, as
Triton's launch path ends by doing. Where this Triton launches otherwise (read once from its
source), or the tensors are in host memory (the interpreter), every launch goes through Triton.
The direct path passes no launch hooks: the tool's own kernels are never calls of the program.
Where the driver can say the compiled kernel's parameters, it is called itself, the interpreter
lock kept (driver_launch.py): the compiled launcher lets the lock go around the launch.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import triton

from replay import driver_launch
from replay.context import recorder_kernel


def _fits() -> bool:
    """Whether this Triton launches a compiled kernel as `kernel.run(grid0, grid1, grid2, stream,
    function, packed_metadata, launch_metadata, enter_hook, exit_hook, *arguments)`, every bound
    argument (constexprs included) last: the call its own launch path makes."""
    try:
        source = inspect.getsource(triton.runtime.jit.JITFunction.run)
    except (OSError, TypeError, AttributeError):
        return False
    source = " ".join(source.split())
    return ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata"
            in source and "launch_exit_hook, *bound_args.values())" in source)


FITS = _fits()


_INT32 = 1 << 31


def _widths(arguments: tuple[Any, ...]) -> tuple[bool, ...]:
    """Which integer arguments Triton passes as 64 bits (it types an integer by its value: from 2^31
    on, or below -2^31): a compiled kernel takes each as it was compiled for, so each way is a
    variant of its own."""
    return tuple([not -_INT32 <= a < _INT32 for a in arguments if type(a) is int])


class DirectLauncher:
    """Launches `kernel` (a @triton.jit function) with `constants` (its constexprs by name, the
    same every launch) and `num_warps`: through Triton the first time on each device and for each
    width of its integer arguments (which compiles), then through that compiled kernel's launcher.
    Its integer parameters are meant to be `do_not_specialize`d: no other property of a value
    is told apart here."""

    def __init__(self, kernel: Any, constants: dict[str, Any], num_warps: int):
        names = list(kernel.arg_names)
        if list(constants) != names[len(names) - len(constants):]:
            raise ValueError(f"{kernel}: the constants must be its last parameters, in order: {names}")
        self.kernel, self.constants, self.num_warps = kernel, constants, num_warps
        self._constant_values = tuple(constants.values())  # after the runtime arguments, as the parameters go
        # per device (a kernel is loaded on one) and integer widths (_widths); None: Triton's launch always
        self.compiled: dict[tuple[int, tuple[bool, ...]], Any] = {}
        # the same, launched through the driver with the interpreter lock kept; None: through the compiled launcher
        self.through_driver: dict[tuple[int, tuple[bool, ...]], driver_launch.KernelLaunch | None] = {}

    def in_triton(self, grid: tuple[int, ...], *arguments: Any) -> Any:
        """Triton's own launch (the interpreter's included); the compiled kernel, where it gives one."""
        with recorder_kernel():  # the tool's own launch: never a call of the program's
            return self.kernel[grid](*arguments, **self.constants, num_warps=self.num_warps)

    def launch(self, device: torch.device, grid: tuple[int, int, int], *arguments: Any) -> None:
        """Queue the kernel on `device`'s current stream (a CPU device: Triton's interpreter, now),
        `arguments` its parameters before the constants, in order."""
        if device.type != "cuda":
            self.in_triton(grid, *arguments)
            return
        current = torch.cuda.current_device()
        index = device.index if device.index is not None else current
        if index != current:  # Triton compiles and loads for the current device: make it `device`
            with torch.cuda.device(index):
                self._launch_on(index, grid, arguments)
        else:
            self._launch_on(index, grid, arguments)

    def _launch_on(self, index: int, grid: tuple[int, int, int], arguments: tuple[Any, ...]) -> None:
        """Launch on device `index`, the current one."""
        variant = (index, _widths(arguments))
        compiled = self.compiled.get(variant, False)
        if compiled is False:
            compiled = self.in_triton(grid, *arguments)
            usable = FITS and hasattr(compiled, "run") and hasattr(compiled, "packed_metadata")
            self.compiled[variant] = compiled if usable else None
            self.through_driver[variant] = driver_launch.prepare(compiled, arguments) if usable else None
            return
        if compiled is None:
            self.in_triton(grid, *arguments)
            return
        stream = triton.runtime.driver.active.get_current_stream(index)
        launch = self.through_driver.get(variant)
        if launch is not None:
            try:
                launch(grid, stream, arguments)
                return
            except driver_launch.Refused as refused:  # not launched: the compiled launcher, which says why
                if refused.for_good:
                    self.through_driver[variant] = None
        try:
            compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *arguments, *self._constant_values)
        except TypeError:  # a launcher that takes its arguments otherwise refuses them before launching
            self.compiled[variant] = None
            self.in_triton(grid, *arguments)
