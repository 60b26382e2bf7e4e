"""A device's current CUDA stream, and an event on it, at what a recorded call can afford.

`torch.cuda.current_stream(device)` goes through torch's lazy initialisation, device-index
parsing and a new Stream object every time: ~20 us in a recording on the H100, four or five times
a recorded launch (docs/PERFORMANCE.md, "Fewer operations a launch"). Here the stream is read with
the one call torch makes underneath, and its Stream object made once per stream. An event is
made and recorded through the CUDA runtime itself where it can be (cuda_runtime.py: no torch
operator, so no wait for the interpreter lock), else through torch.
"""
from __future__ import annotations

from typing import Protocol

import torch

from replay.recorder import cuda_runtime

_STREAMS_KEPT = 1024  # Stream objects kept; past it they are made again (a program making streams without end)
_streams: dict[tuple[int, int], torch.cuda.Stream] = {}


def current(device: torch.device) -> torch.cuda.Stream:
    """The stream work on `device` (a CUDA device, initialised: a tensor lives there) is issued on now."""
    index = device.index if device.index is not None else torch.cuda.current_device()
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


def event_now(device: torch.device) -> Landing:
    """An event recorded on `device`'s current stream: it passes once the work issued there so far has run."""
    runtime = cuda_runtime.on_current_device(device)
    if runtime is not None:
        return runtime.event(runtime.current_stream(device.index))
    event = torch.cuda.Event()
    event.record(current(device))
    return event
