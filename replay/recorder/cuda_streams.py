"""A device's current CUDA stream, an event on it, and work issued on another, at what a recorded
(or verified) call can afford.

`torch.cuda.current_stream(device)` goes through torch's lazy initialisation, device-index
parsing and a new Stream object every time: ~20 us in a recording on the H100, four or five times
a recorded launch (docs/PERFORMANCE.md, "Fewer operations a launch"). Here the stream is read with
the one call torch makes underneath, and its Stream object made once per stream. An event is
made and recorded through the CUDA runtime itself where it can be (cuda_runtime.py: no torch
operator, so no wait for the interpreter lock), else through torch. `issuing_on(stream)` makes a
stream current for a few launches with the one call torch makes underneath, where
`torch.cuda.stream(stream)` costs 9-14 us on an H200 host (its Python looks the current stream up
twice, through the same parsing as above).
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from replay.recorder import cuda_runtime

_STREAMS_KEPT = 1024  # Stream objects kept; past it they are made again (a program making streams without end)
_streams: dict[tuple[int, int], torch.cuda.Stream] = {}


def current(device: torch.device | int) -> torch.cuda.Stream:
    """The stream work on `device` (a CUDA device or its index, initialised: a tensor lives there)
    is issued on now."""
    index = device if isinstance(device, int) else \
        device.index if device.index is not None else torch.cuda.current_device()
    stream_id, index, device_type = torch._C._cuda_getCurrentStream(index)
    stream = _streams.get((index, stream_id))
    if stream is None:
        if len(_streams) >= _STREAMS_KEPT:
            _streams.clear()
        stream = _streams[index, stream_id] = torch.cuda.Stream(stream_id=stream_id, device_index=index,
                                                                device_type=device_type)
    return stream


class Landing(Protocol):
    """What readers of host copies wait on: an event, or what stands for one."""
    def synchronize(self) -> None: ...

    def query(self) -> bool: ...


def event_now(device: torch.device) -> Landing:
    """An event recorded on `device`'s current stream: it passes once the work issued there so far has run."""
    runtime = cuda_runtime.on_current_device(device)
    if runtime is not None:
        return runtime.event(runtime.current_stream(device.index))
    event = torch.cuda.Event()
    event.record(current(device))
    return event


class issuing_on:  # noqa: N801 (used as a context, as torch.cuda.stream is)
    """Work issued inside goes to `stream` (a CUDA stream on the current device: elsewhere, and
    where this torch has no such call, through `torch.cuda.stream`); the stream current before is
    current again after."""
    __slots__ = ("_stream", "_before", "_fallback")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self._stream = stream
        self._fallback: Any = None

    def __enter__(self) -> None:
        stream = self._stream
        if _SET_STREAM is None or stream.device_index != torch.cuda.current_device():
            self._fallback = torch.cuda.stream(stream)
            self._fallback.__enter__()
            return
        self._before = torch._C._cuda_getCurrentStream(stream.device_index)
        _SET_STREAM(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)

    def __exit__(self, *exc: object) -> None:
        if self._fallback is not None:
            self._fallback.__exit__(*exc)
            return
        stream_id, index, device_type = self._before
        assert _SET_STREAM is not None  # else __enter__ took the fallback
        _SET_STREAM(stream_id=stream_id, device_index=index, device_type=device_type)


_SET_STREAM = getattr(torch._C, "_cuda_setStream", None)  # what torch.cuda.set_stream calls; absent without CUDA
