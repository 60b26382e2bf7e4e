"""A checked call's reference replayed as a CUDA graph: one launch on the calling thread, where
running the reference eagerly costs a launch an operator (the tiny model's attention reference:
~30 operators, ~1 ms of the program's thread a check on an H200 host: docs/PERFORMANCE.md).

A graph serves one *kind* of check: an op, and for each argument its type, shape, strides and
device (a tensor) or its value (anything else; an argument with no hashable value has no kind),
and for a large read-only input that a check reads in place instead of copying (a weight:
verifier._read_in_place) its address, which the graph reads. The first check of a kind runs eagerly
(most kinds a sampled check meets, it meets once); the second captures the kind's graph. A graph
owns static tensors: the copies of the inputs and outputs that a check of its kind takes into them
instead of into fresh clones, and what the reference and the comparison leave in its own memory
pool (expected outputs, verdicts). From a check's copies until its verdict has been read (and a
mismatch's snapshot written), a graph is busy: a check of the same kind meanwhile runs eagerly.

A reference that cannot be captured (it reads a value back on the host, or calls what a capture
forbids) is run eagerly from then on; the failed capture is ended, and its allocator routing
ended by hand (torch's capture_end leaves it on when the capture was invalidated), so the stream
serves on. A kind has no graph where an argument is a tensor on another device
than the check's (a host scalar tensor a capture would read once) or anything but a tensor or a
plain scalar. One thread at a time issues work on the verifier's reference streams (its
Verifier's lock): a capture on one must hold nothing of another thread's checks.
Bounds: KINDS kinds remembered an op, GRAPH_BYTES of device memory over every graph; the least
recently used idle graphs, of any op, go first. A graph that alone needs more runs its kind
eagerly. An op declared anew (its reference, tolerance or metric changed) starts again.

Captures and replays go through CUDAGraph's own methods, not those a recording wraps (a
recording would follow the verifier's graph as the program's).
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import numpy as np
import torch

from replay.recorder import gather_copy, lifecycle

GRAPH_DEVICES = ("cuda",)  # tests add "cpu": the same bookkeeping, a host twin of each graph
KINDS = 64  # kinds remembered an op (graphs or first sightings); the least recently met forgotten past it
GRAPH_BYTES = 256 << 20  # device memory the graphs of every op may hold together

Kind = tuple
Result = tuple[dict[str, Any], list[tuple[str, torch.Tensor, torch.Tensor]], list[torch.Tensor | None]]
_TOO_LARGE = "too large"  # a kind whose graph alone would pass GRAPH_BYTES: checked eagerly


def kind_of(op: str, arguments: dict[str, Any], device_type: str, in_place: Collection[str]) -> Kind | None:
    """A check's kind (module docstring), or None where an argument has none: a tensor elsewhere
    than the check's device type (a host tensor a capture would read once, as a scalar), not
    strided, or anything but a tensor or a plain scalar (a float by its repr: -0.0 is not 0.0,
    and NaN is NaN). `in_place`: the arguments a check reads where they are, not copied."""
    parts: list[Any] = [op]
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            if value.device.type != device_type or value.layout is not torch.strided or value.is_nested:
                return None
            parts.append((name, value.dtype, value.device, value.shape, value.stride(),
                          value.data_ptr() if name in in_place else None))
        elif isinstance(value, float):
            parts.append((name, float, repr(value)))
        elif value is None or isinstance(value, (bool, int, str)):
            parts.append((name, type(value), value))
        else:  # a list of tensors, a tuple, an object: what a graph would bake in is not known
            return None
    return tuple(parts)


@dataclass(eq=False)
class Graph:
    """One kind's graph: its static tensors, and once captured, what replays it and the tensors a
    replay writes (expected outputs, the comparisons, the device's verdicts)."""
    kind: Kind
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    after: dict[str, torch.Tensor] = field(default_factory=dict)
    replay: Callable[[], None] | None = None
    result: Result | None = None
    # whether every output agreed, copied by each replay into host memory (pinned on a GPU), seen
    # through numpy: read with no operator; None where an output is decided on the host
    agreed: np.ndarray | None = None
    events: tuple[Any, Any] | None = None  # its checks' CUDA events, made once (verifier._events)
    nbytes: int = 0  # counted in ReferenceGraphs.bytes from `captured` on (`counted`)
    counted: bool = False
    busy: bool = True
    unfit: bool = False  # a check's tensor did not fit a static: that check ran eagerly, and the graph goes
    copy_plans: dict[tuple[str, ...], gather_copy.FixedCopies | None] = field(default_factory=dict)  # copy_into


def copy_into(graph: Graph, part: str, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each of `values` copied into the graph's static tensor of that name in `part` ("inputs" or
    "after": the outputs), on the current stream, in one launch for them all; a static is made
    like a clone the first time. Where one does not fit (an output of another shape for the same
    inputs), that value is cloned and the graph is unfit for this check. Where every value's and
    static's bytes are its values in one run (_bytes_as_they_read), on one device, the launch is a
    copy of bytes through the part's table of rows (gather_copy.FixedCopies), else torch's
    multi-tensor copy."""
    statics = graph.inputs if part == "inputs" else graph.after
    copies, targets, sources = {}, [], []
    contiguous = True  # every value's bytes in one run, as its static holds them (_bytes_as_they_read)
    for name, value in values.items():
        held = statics.get(name)
        if held is None:
            held = statics[name] = value.detach().clone()
        elif held.shape != value.shape or held.dtype != value.dtype or held.device != value.device:
            graph.unfit = True
            held = value.detach().clone()
        else:
            targets.append(held)
            sources.append(value.detach() if value.requires_grad else value)
            contiguous = contiguous and _bytes_as_they_read(value)
        copies[name] = held
    if not targets:
        return copies
    plan = _copy_plan(graph, (part, *values), targets) if contiguous and len(targets) == len(values) else None
    if plan is not None:
        plan.launch([source.data_ptr() for source in sources])
    else:
        torch._foreach_copy_(targets, sources)
    return copies


def _copy_plan(graph: Graph, names: tuple[str, ...], targets: list[torch.Tensor]) -> gather_copy.FixedCopies | None:
    """The table of copies into `targets`, the statics `names` (a part, then its tensors' names)
    holds (a static, once made, is the graph's for good), made at first use; None where a static
    is not one run of bytes as read, or they are not all on one device."""
    if names not in graph.copy_plans:
        device = targets[0].device
        dense = all(_bytes_as_they_read(target) and target.device == device for target in targets)
        graph.copy_plans[names] = gather_copy.FixedCopies(
            [(target.data_ptr(), target.numel() * target.element_size()) for target in targets],
            device) if dense else None
    return graph.copy_plans[names]


def _bytes_as_they_read(t: torch.Tensor) -> bool:
    """Whether `t`'s values are its bytes, in one run from its address: a plain tensor (a wrapper
    subclass's address is none of its data), contiguous, with no lazy conjugation or negation."""
    return type(t) is torch.Tensor and t.is_contiguous() and not t.is_conj() and not t.is_neg()


class ReferenceGraphs:
    """The graphs of every verified op, taken by a check and given back once its verdict is read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, OrderedDict[Kind, Graph | str | None]] = {}  # op -> kind -> its graph
        self._counted: OrderedDict[Graph, None] = OrderedDict()  # graphs whose bytes count, least recently used first
        self._eager: set[str] = set()  # ops whose reference could not be captured
        self._owners: dict[str, object] = {}  # op -> its declaration when its graphs were captured
        self.bytes = 0
        self.captures = 0

    def take(self, op: str, kind: Kind | None, owner: object) -> Graph | None:
        """The kind's graph, busy now (captured or still to be), or None: check this call eagerly.
        `owner` is what the graphs bake in of the op's declaration (its reference, tolerance and
        metric, compared with ==): when it changes, the op's graphs and its past capture failure
        are forgotten. Graphs outlive a verification stopped and started again (the bounds keep
        them few)."""
        if kind is None:
            return None
        with self._lock:
            if op in self._owners and self._owners[op] != owner:
                self._eager.discard(op)
                self._drop(op)
            self._owners[op] = owner
            if op in self._eager:
                return None
            kinds = self._kinds.setdefault(op, OrderedDict())
            if kind not in kinds:  # a first sighting: eagerly, remembered
                kinds[kind] = None
                self._trim(kinds)
                return None
            kinds.move_to_end(kind)
            graph = kinds[kind]
            if graph is None:  # a second: its graph is captured at this check
                graph = kinds[kind] = Graph(kind)
                return graph
            if not isinstance(graph, Graph) or graph.busy:  # too large, or in use
                return None
            graph.busy = True
            if graph.counted:
                self._counted.move_to_end(graph)
            return graph

    def release(self, graph: Graph) -> None:
        """The check is done with the graph's tensors (or never reached it); an unfit
        graph is forgotten."""
        with self._lock:
            graph.busy = False
            kinds = self._kinds.get(graph.kind[0])
            if graph.unfit and kinds is not None and kinds.get(graph.kind) is graph:
                del kinds[graph.kind]
                self._uncount(graph)

    def captured(self, graph: Graph) -> bool:
        """Count a new graph's memory; False (and the kind checked eagerly from now on) if it alone
        would pass GRAPH_BYTES. Idle graphs of any op go, least recently used first, to make room."""
        with self._lock:
            self.captures += 1
            kinds = self._kinds.get(graph.kind[0])
            if kinds is None or kinds.get(graph.kind) is not graph:  # forgotten meanwhile
                return True
            if graph.nbytes > GRAPH_BYTES:
                kinds[graph.kind] = _TOO_LARGE
                return False
            for other in list(self._counted):
                if self.bytes + graph.nbytes <= GRAPH_BYTES:
                    break
                if not other.busy:
                    del self._kinds[other.kind[0]][other.kind]
                    self._uncount(other)
            graph.counted = True
            self._counted[graph] = None
            self.bytes += graph.nbytes
            return True

    def uncapturable(self, op: str) -> None:
        """The op's reference could not be captured: its graphs go, and every check of it runs
        eagerly from now on (until it is declared anew)."""
        with self._lock:
            self._eager.add(op)
            self._drop(op)

    def _drop(self, op: str) -> None:
        for graph in self._kinds.pop(op, {}).values():
            if isinstance(graph, Graph):
                self._uncount(graph)

    def _uncount(self, graph: Graph) -> None:
        if graph.counted:
            graph.counted = False
            del self._counted[graph]
            self.bytes -= graph.nbytes

    def _trim(self, kinds: OrderedDict[Kind, Graph | str | None]) -> None:
        for kind, graph in list(kinds.items()):
            if len(kinds) <= KINDS:
                return
            if not (isinstance(graph, Graph) and graph.busy):
                del kinds[kind]
                if isinstance(graph, Graph):
                    self._uncount(graph)


def capture(graph: Graph, body: Callable[[], Result], cuda: bool) -> None:
    """Capture `body` (the reference and the comparison, reading the graph's statics) into the
    graph, on the current stream, which nothing else may use meanwhile; nothing runs yet:
    `graph.replay()` runs it. Raises what the capture raised (the graph is then unusable)."""
    statics = sum(t.numel() * t.element_size() for t in (*graph.inputs.values(), *graph.after.values()))
    agreed = torch.zeros((), dtype=torch.bool, pin_memory=cuda)  # pinned outside the capture: no allocation in it

    def with_verdict() -> Result:
        result = body()
        flags = [v for v in result[2] if v is not None]
        if len(flags) == len(result[2]):
            graph.agreed = agreed.numpy()
            agreed.copy_(torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool), non_blocking=True)
        return result

    if not cuda:  # the host twin: a "replay" runs the body again into the tensors of its first run
        graph.result = with_verdict()
        graph.replay = lambda: _run_into(graph, with_verdict())
        graph.nbytes = statics
        return
    cuda_graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()  # its own, named here: a failed capture's routing is ended by it
    reserved = torch.cuda.memory_reserved()
    lifecycle.graph_method("capture_begin")(cuda_graph, pool=pool, capture_error_mode="thread_local")
    try:
        result = with_verdict()
    except BaseException:
        _abandon(cuda_graph, pool)
        raise
    try:
        lifecycle.graph_method("capture_end")(cuda_graph)
    except BaseException:
        _abandon(cuda_graph, pool)
        raise
    replay = lifecycle.graph_method("replay")
    graph.result, graph.replay = result, lambda: replay(cuda_graph)
    # the pool's segments it reserved (other threads allocating meanwhile make this an estimate)
    graph.nbytes = statics + max(torch.cuda.memory_reserved() - reserved, 0)


def _abandon(cuda_graph: Any, pool: Any) -> None:
    """End a failed capture. Torch's capture_end raises before it stops routing allocations to the
    graph's pool when the capture was invalidated (a read back on the host, a forbidden call):
    left so, the allocator would keep a capture "underway" for the rest of the process (freeing
    memory used on other streams deferred for good, every allocation checked). So the routing is
    ended here, by the pool's id; where capture_end ended it, that raises, and is let be."""
    with contextlib.suppress(Exception):
        lifecycle.graph_method("capture_end")(cuda_graph)
    end_routing = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end_routing is not None:
        with contextlib.suppress(Exception):
            end_routing(torch.cuda.current_device(), pool)


def _run_into(graph: Graph, fresh: Result) -> None:
    """The host twin's replay: the fresh run's tensors copied into those of the first run, as a
    graph's replay rewrites its memory. A run that does not fit them (an output's shape that
    depends on the values, a verdict left to the host) is one a GPU could not have captured:
    it raises, and the check goes eager."""
    assert graph.result is not None
    expected, _, verdicts = graph.result
    for name, value in fresh[0].items():
        if isinstance(value, torch.Tensor):
            if expected[name].shape != value.shape or expected[name].dtype != value.dtype:
                raise RuntimeError(f"the reference's '{name}' changed shape: a CUDA graph could not hold it")
            expected[name].copy_(value)
    for verdict, new in zip(verdicts, fresh[2]):
        if (verdict is None) != (new is None):
            raise RuntimeError("a verdict moved between the device and the host: a CUDA graph could not hold it")
        if verdict is not None and new is not None:
            verdict.copy_(new)
