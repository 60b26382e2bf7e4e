"""The CUDA runtime torch loaded, called directly for the device work a recorded call issues.

A torch operator lets go of the interpreter lock while it works and must take it back after:
beside a writer thread that wants the lock, that wait costs up to a switch interval (250-700 us
an operator on the H200 host, against 2-10 alone: docs/PERFORMANCE.md, "The mechanism, one
operation at a time"). Work that only queues on a stream (a copy into pinned memory, an event
recorded) is called here through `ctypes.PyDLL`, which keeps the lock: ~5 us either way. Waiting
for an event goes through `ctypes.CDLL`, which lets the lock go, as a wait should.

`loaded()` is None where this cannot be done as torch does it (no CUDA runtime mapped into the
process, as on a CPU-only torch); the callers then use torch's operators. Tests add "cpu" to
HOST_TWINS to run the same path on host tensors, its work done at once (HostRuntime).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

_DEVICE_TO_HOST, _DEVICE_TO_DEVICE = 2, 3  # cudaMemcpyKind
HOST_TWINS: tuple[str, ...] = ()  # device types served by HostRuntime (tests add "cpu")
_DISABLE_TIMING = 2  # cudaEventDisableTiming: an event only waited for records no time
_NOT_READY = 600  # cudaErrorNotReady: what cudaEventQuery says of work still queued


class Runtime:
    """The runtime's entry points used here, each typed; `keeping` the lock, `waiting` without it."""

    def __init__(self, path: str):
        self.keeping, self.waiting = ctypes.PyDLL(path), ctypes.CDLL(path)
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        for name, arguments in (("cudaMemcpyAsync", [pointer, pointer, size, ctypes.c_int, pointer]),
                                ("cudaMemsetAsync", [pointer, ctypes.c_int, size, pointer]),
                                ("cudaEventCreateWithFlags", [ctypes.POINTER(pointer), ctypes.c_uint]),
                                ("cudaEventRecord", [pointer, pointer]), ("cudaEventDestroy", [pointer]),
                                ("cudaGetLastError", [])):
            function = getattr(self.keeping, name)
            function.argtypes, function.restype = arguments, ctypes.c_int
        self.keeping.cudaEventQuery.argtypes, self.keeping.cudaEventQuery.restype = [pointer], ctypes.c_int
        for name in ("cudaEventSynchronize", "cudaStreamSynchronize"):
            function = getattr(self.waiting, name)
            function.argtypes, function.restype = [pointer], ctypes.c_int
        self.keeping.cudaGetErrorString.argtypes = [ctypes.c_int]
        self.keeping.cudaGetErrorString.restype = ctypes.c_char_p
        self.current_stream = torch._C._cuda_getCurrentRawStream  # the stream's address, no Stream object
        self.current_device = torch._C._cuda_getDevice  # read as torch reads it, in C with the lock kept

    def fail(self, code: int, what: str) -> None:
        """A failed call's RuntimeError, the thread's last error cleared (else torch's next check of
        it would blame its own operator for this one). Callers test the code first: a call a copy."""
        self.keeping.cudaGetLastError()
        raise RuntimeError(f"CUDA error: {self.keeping.cudaGetErrorString(code).decode()} ({what})")

    def copy_to_host(self, host: int, device: int, nbytes: int, stream: int) -> None:
        """Queue a copy of `nbytes` at device address `device` into pinned host memory at `host`."""
        self._copy(host, device, nbytes, _DEVICE_TO_HOST, stream)

    def copy_on_device(self, target: int, source: int, nbytes: int, stream: int) -> None:
        """Queue a copy of `nbytes` from device address `source` to device address `target`."""
        self._copy(target, source, nbytes, _DEVICE_TO_DEVICE, stream)

    def _copy(self, target: int, source: int, nbytes: int, kind: int, stream: int) -> None:
        if not nbytes:  # an empty tensor's address may be none at all: nothing to queue, as torch does
            return
        code = self.keeping.cudaMemcpyAsync(target, source, nbytes, kind, stream)
        if code:
            self.fail(code, "cudaMemcpyAsync")

    def memset(self, target: int, value: int, nbytes: int, stream: int) -> None:
        """Queue setting `nbytes` of device memory at `target` to the byte `value`."""
        code = self.keeping.cudaMemsetAsync(target, value, nbytes, stream)
        if code:
            self.fail(code, "cudaMemsetAsync")

    def synchronize(self, stream: int) -> None:
        """Wait, the lock let go, until the work queued on `stream` has run."""
        code = self.waiting.cudaStreamSynchronize(stream)
        if code:
            self.fail(code, "cudaStreamSynchronize")

    def event(self, stream: int) -> Event:
        """An event recorded on `stream` now."""
        return Event(self, stream)


class Event:
    """An event recorded on a stream of the device current when it is made; synchronize() waits
    for it with the interpreter lock let go."""

    __slots__ = ("_runtime", "_handle")

    def __init__(self, runtime: Runtime, stream: int):
        self._runtime = runtime
        self._handle = ctypes.c_void_p()
        code = runtime.keeping.cudaEventCreateWithFlags(ctypes.byref(self._handle), _DISABLE_TIMING)
        if code:
            runtime.fail(code, "cudaEventCreateWithFlags")
        code = runtime.keeping.cudaEventRecord(self._handle, stream)
        if code:
            runtime.fail(code, "cudaEventRecord")

    def synchronize(self) -> None:
        code = self._runtime.waiting.cudaEventSynchronize(self._handle)
        if code:
            self._runtime.fail(code, "cudaEventSynchronize")

    def query(self) -> bool:
        """Whether the work before it has run, without waiting (an error: True, for synchronize() to raise)."""
        return self._runtime.keeping.cudaEventQuery(self._handle) != _NOT_READY

    def __del__(self) -> None:
        if self._handle:  # made: let go (errors as the process ends, when the context is gone, ignored)
            self._runtime.keeping.cudaEventDestroy(self._handle)


class HostRuntime:
    """The runtime's calls done at once on host memory (the interpreter's tensors): the recorder's
    runtime path run on the host, for tests (HOST_TWINS), as chunk_changes.DEVICES runs the
    checksums there."""

    @staticmethod
    def current_stream(index: int | None) -> int:
        return 0

    @staticmethod
    def copy_to_host(target: int, source: int, nbytes: int, stream: int) -> None:
        if nbytes:
            ctypes.memmove(target, source, nbytes)

    copy_on_device = copy_to_host

    @staticmethod
    def memset(target: int, value: int, nbytes: int, stream: int) -> None:
        if nbytes:
            ctypes.memset(target, value, nbytes)

    @staticmethod
    def synchronize(stream: int) -> None:
        pass

    @staticmethod
    def event(stream: int) -> _Done:
        return _DONE


class _Done:
    """An event whose work is done (the host's): nothing to wait for."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_HOST, _DONE = HostRuntime(), _Done()


@functools.cache
def loaded() -> Runtime | None:
    """The runtime torch mapped into this process, or None where there is none to call."""
    if not hasattr(torch._C, "_cuda_getCurrentRawStream"):
        return None
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    mapped = [line.split()[-1] for line in maps if "/libcudart.so" in line]
    # torch's own first (another package may map a runtime of another version)
    ours = f"/libcudart.so.{(torch.version.cuda or '').split('.')[0]}"
    path = next((p for p in mapped if ours in p), mapped[0] if mapped else None)
    return Runtime(path) if path is not None else None


def on_current_device(device: torch.device) -> Runtime | HostRuntime | None:
    """The runtime, where work for `device` may be issued through it now: events are made on the
    thread's current device, so a tensor on another device goes through torch instead."""
    if device.type in HOST_TWINS:
        return _HOST
    runtime = loaded()
    if runtime is None or device.index is None or runtime.current_device() != device.index:
        return None
    return runtime
