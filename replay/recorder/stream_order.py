"""The order CUDA streams put calls in: a vector clock per stream, moved by events and waits.

A call issued on stream S after the program made S wait for an event (or the host wait for a
stream, an event or the device) comes after everything that event covered; two calls on
different streams with no such chain between them may run in either order or at once. Each
recorded call on a GPU keeps its stream and that stream's clock at issue in `meta.order`
(docs/FORMAT.md), and `replay graph` reports calls that touch the same bytes, one writing, with
no order between them (replay/dataflow/graph.py).

While a recording is active on a machine with CUDA, the methods every wait ends in are wrapped:
`torch.cuda.Event.record`, `.wait` and `.synchronize`, `torch.cuda.Stream.synchronize` and
`torch.cuda.synchronize` (`Stream.wait_event`, `wait_stream` and `record_event` go through the
Event methods). A wait the program makes without them (`.item()`, `.cpu()`, a blocking copy) is
not seen: a race reported across one is a false alarm, and the report says so.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import torch

from replay.recorder import cuda_streams

Clock = dict[str, int]
EVENTS_KEPT = 4096


def stream_key(stream: Any) -> str:
    """A stream's name in a recording: its device and stream id (`cuda:0#3`)."""
    return f"cuda:{stream.device_index}#{stream.stream_id}"


def current_stream(device: str) -> str:
    """The name of the stream a call on `device` (`cuda:1`) is issued on now."""
    return stream_key(cuda_streams.current(torch.device(device)))


def _key(stream: Any) -> str:
    return stream_key(stream if stream is not None else torch.cuda.current_stream())


def _merged(a: Clock, b: Clock) -> Clock:
    out = dict(a)
    for stream, count in b.items():
        if out.get(stream, 0) < count:
            out[stream] = count
    return out


class StreamClocks:
    """Vector clocks of the streams a recording saw, the events recorded on them, and the host."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, Clock] = {}
        # per thread, what it has waited for: everything it issues after comes later
        self._hosts: dict[int, Clock] = {}
        self._local = threading.local()  # `paused` on a thread doing the recorder's own copies
        # the last EVENTS_KEPT events recorded, held (a weak reference to a torch object crashed torch
        # 2.11's garbage collector on the H100): a wait for one older than that orders nothing
        self._events: collections.OrderedDict[int, tuple[Any, Clock]] = collections.OrderedDict()

    def paused(self) -> "_Paused":
        """The recorder's own copies and their waits: they order the program's streams only while
        it records (its copy of an input waits for the producer, the consumer for the copy), an
        order the program does not have, so they are left out. Entered twice a recorded call: a
        plain object, not a generator."""
        return _Paused(self._local)

    def watching(self) -> bool:
        """False on a thread doing the recorder's own work (its waits are left out)."""
        return not getattr(self._local, "paused", False)

    def _host(self) -> Clock:
        return self._hosts.get(threading.get_ident(), {})

    def issue(self, stream: str) -> dict[str, Any]:
        """A call issued on `stream` now: its place in the stream order, as `meta.order` holds it."""
        with self._lock:
            clock = _merged(self._streams.get(stream, {}), self._host())
            clock[stream] = clock.get(stream, 0) + 1
            self._streams[stream] = clock
            return {"stream": stream, "clock": dict(clock)}

    def recorded(self, event: Any, stream: str) -> None:
        with self._lock:
            self._events.pop(id(event), None)
            self._events[id(event)] = (event, _merged(self._streams.get(stream, {}), self._host()))
            if len(self._events) > EVENTS_KEPT:
                self._events.popitem(last=False)

    def _event_clock(self, event: Any) -> Clock | None:
        kept = self._events.get(id(event))
        return kept[1] if kept is not None and kept[0] is event else None

    def waited(self, stream: str, event: Any) -> None:
        """`stream` waits for `event` (an event never recorded is complete: nothing to wait for)."""
        with self._lock:
            clock = self._event_clock(event)
            if clock is not None:
                self._streams[stream] = _merged(self._streams.get(stream, {}), clock)

    # What the wrapped torch.cuda methods call, after torch's own: nothing on the recorder's own thread
    # work (its copies record events at every call), the current stream where none is named.
    def on_record(self, event: Any, stream: Any) -> None:
        if self.watching():
            self.recorded(event, _key(stream))

    def on_wait(self, event: Any, stream: Any) -> None:
        if self.watching():
            self.waited(_key(stream), event)

    def on_host_wait(self, *, event: Any = None, stream: Any = None, device: Any = None) -> None:
        if not self.watching():
            return
        if event is not None:
            self.host_waited(event=event)
        elif stream is not None:
            self.host_waited(stream=stream_key(stream))
        else:
            self.host_waited(device=torch.cuda._utils._get_device_index(device, optional=True))

    def host_waited(self, *, event: Any = None, stream: str | None = None, device: int | None = None) -> None:
        """This thread waited for an event, a stream, or every stream of a device."""
        with self._lock:
            if event is not None:
                covered = [self._event_clock(event) or {}]
            elif stream is not None:
                covered = [self._streams.get(stream, {})]
            else:
                prefix = f"cuda:{device}#"
                covered = [c for s, c in self._streams.items() if s.startswith(prefix)]
            host = self._host()
            for clock in covered:
                host = _merged(host, clock)
            self._hosts[threading.get_ident()] = host


class _Paused:
    __slots__ = ("_local",)

    def __init__(self, local: threading.local) -> None:
        self._local = local

    def __enter__(self) -> None:
        self._local.paused = True

    def __exit__(self, *exc: object) -> None:
        self._local.paused = False


_installed: list[tuple[Any, str, Callable[..., Any]]] = []  # (owner, attribute, torch's own) while wrapped


def install(clocks: StreamClocks) -> None:
    """Wrap the methods waits end in, feeding `clocks`; `uninstall` puts torch's own back."""
    if _installed:
        uninstall()
    event, stream_cls = torch.cuda.Event, torch.cuda.Stream

    def record(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any, stream: Any = None) -> None:
            original(self, stream)
            clocks.on_record(self, stream)
        return wrapped

    def wait(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any, stream: Any = None) -> None:
            original(self, stream)
            clocks.on_wait(self, stream)
        return wrapped

    def event_synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any) -> None:
            original(self)
            clocks.on_host_wait(event=self)
        return wrapped

    def stream_synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(self: Any) -> None:
            original(self)
            clocks.on_host_wait(stream=self)
        return wrapped

    def device_synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(device: Any = None) -> None:
            original(device)
            clocks.on_host_wait(device=device)
        return wrapped

    for owner, name, wrap in ((event, "record", record), (event, "wait", wait),
                              (event, "synchronize", event_synchronize),
                              (stream_cls, "synchronize", stream_synchronize),
                              (torch.cuda, "synchronize", device_synchronize)):
        original = owner.__dict__[name]
        _installed.append((owner, name, original))
        setattr(owner, name, wrap(original))


def uninstall() -> None:
    while _installed:
        owner, name, original = _installed.pop()
        setattr(owner, name, original)
