"""The tool's own compiled Triton kernels launched through the CUDA driver, the interpreter lock kept.

Triton's launcher lets go of the interpreter lock around cuLaunchKernel and takes it back after:
beside a writer thread that wants the lock, that costs the program's thread up to a switch
interval a launch, as a torch operator does (docs/PERFORMANCE.md, "The mechanism, one operation at
a time"). A launch only queues work, so the tool's own kernels (direct_launch.py) are launched here
through `ctypes.PyDLL`, which keeps the lock. What the compiled kernel takes is read from the
driver (cuFuncGetParamInfo, drivers of CUDA 12.4 and later): each argument's size, then the
scratch pointers Triton appends (passed null). A kernel that needs what Triton's launcher sets up
(scratch memory, clusters, cooperative or programmatic-dependent launch) is not prepared here,
nor is any where the driver cannot say its parameters: Triton's launcher serves those.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

_MAX_PARAMETERS = 256
_INT32 = 1 << 31
_SCRATCH_POINTERS = 2  # global and profile scratch, after the kernel's own parameters (Triton 3.3 on)


_NO_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT: a thread that never made one current (Triton's launcher does)


class Refused(RuntimeError):
    """The driver refused a launch (it did not happen): its CUresult."""

    def __init__(self, code: int):
        super().__init__(f"cuLaunchKernel: CUresult {code}")
        self.code = code

    @property
    def for_good(self) -> bool:
        """Whether every later launch of the kernel would be refused too (not this thread's context alone)."""
        return self.code != _NO_CONTEXT


class Driver:
    """libcuda's entry points used here, typed, called with the interpreter lock kept."""

    def __init__(self, library: ctypes.PyDLL):
        pointer, uint = ctypes.c_void_p, ctypes.c_uint
        self.launch_kernel = library.cuLaunchKernel
        self.launch_kernel.argtypes = [pointer, uint, uint, uint, uint, uint, uint, uint, pointer,
                                       ctypes.POINTER(pointer), pointer]
        self.launch_kernel.restype = ctypes.c_int
        self.parameter_info = library.cuFuncGetParamInfo  # AttributeError on a driver before CUDA 12.4
        self.parameter_info.argtypes = [pointer, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                        ctypes.POINTER(ctypes.c_size_t)]
        self.parameter_info.restype = ctypes.c_int

    def parameter_sizes(self, function: int) -> list[int]:
        """The byte size of each parameter of the kernel `function` (a CUfunction), in order."""
        sizes: list[int] = []
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        while len(sizes) < _MAX_PARAMETERS and not self.parameter_info(function, len(sizes), ctypes.byref(offset),
                                                                        ctypes.byref(size)):
            sizes.append(size.value)
        return sizes


@functools.cache
def loaded() -> Driver | None:
    """The driver, where one is installed that can say a kernel's parameters; else None."""
    try:
        return Driver(ctypes.PyDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None


class KernelLaunch:
    """One compiled kernel launched through `driver`: its CUfunction, threads a block, dynamic
    shared memory, and each parameter's size (its arguments', then the null scratch pointers)."""

    def __init__(self, driver: Driver, function: int, threads: int, shared: int, sizes: list[int], arguments: int):
        self._driver, self._function, self._threads, self._shared = driver, function, threads, shared
        self._widths = [ctypes.c_int32 if size == 4 else ctypes.c_int64 for size in sizes[:arguments]]
        self._scratch = [ctypes.c_uint64(0) for _ in sizes[arguments:]]

    def __call__(self, grid: tuple[int, int, int], stream: int, arguments: tuple[Any, ...]) -> None:
        """Queue the kernel on `stream` (ints, and tensors passed by address); an empty grid launches
        nothing, as in Triton's launcher."""
        if not (grid[0] and grid[1] and grid[2]):
            return
        values: list[ctypes._SimpleCData] = [width(a.data_ptr() if isinstance(a, torch.Tensor) else a)
                                             for width, a in zip(self._widths, arguments)]
        values += self._scratch
        parameters = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        code = self._driver.launch_kernel(self._function, *grid, self._threads, 1, 1, self._shared, stream,
                                          parameters, None)
        if code:
            raise Refused(code)


def prepare(compiled: Any, arguments: tuple[Any, ...], driver: Driver | None = None) -> KernelLaunch | None:
    """A driver launch of `compiled` (Triton's CompiledKernel, launched once) for arguments like
    `arguments` (ints of the same widths, tensors), or None where it cannot be made as Triton's
    launcher would make it."""
    driver = driver or loaded()
    metadata = getattr(compiled, "metadata", None)
    if driver is None or metadata is None or not hasattr(compiled, "function"):
        return None
    plain = (getattr(metadata, "num_ctas", 1) == 1 and tuple(getattr(metadata, "cluster_dims", (1, 1, 1))) == (1, 1, 1)
             and not getattr(metadata, "launch_cooperative_grid", False) and not getattr(metadata, "launch_pdl", False)
             and not getattr(metadata, "global_scratch_size", 0) and not getattr(metadata, "profile_scratch_size", 0))
    if not plain:
        return None
    sizes = driver.parameter_sizes(compiled.function)
    expected = [_size(a) for a in arguments]
    scratch = sizes[len(arguments):]
    if sizes[:len(arguments)] != expected or len(scratch) > _SCRATCH_POINTERS or any(s != 8 for s in scratch):
        return None
    return KernelLaunch(driver, compiled.function, 32 * metadata.num_warps, metadata.shared, sizes, len(arguments))


def _size(argument: Any) -> int:
    """The parameter size Triton compiles for an argument (an int: by its value; 0: not passed here)."""
    if type(argument) is int:
        return 4 if -_INT32 <= argument < _INT32 else 8
    return 8 if isinstance(argument, torch.Tensor) else 0
