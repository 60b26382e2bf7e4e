"""Checking calls against their reference off the critical path.

A verified call returns its own result at once, and nothing on the program's thread waits for
the device. An unchecked call costs a counter and two comparisons (and, with the outlier gate
on, its arguments noted for the gate: replay/verify/gate.py). A sampled call, or one of the
WINDOW calls after one the gate found unusual, has its inputs copied before it runs and its
outputs after, on the program's stream (the program waits for those copies, nothing more). The
op's reference then runs on the copies on a stream of the verifier's, after an event, and the
comparison is reduced there to one flag (compare.agreement). A check replayed through its
kind's graph (reference_graphs.py), reading nothing of the program's in place, lands its flag
in host memory, and the calling thread reads it at its next check past the fast path (or a
drain, or `stop`) once the reference's event has passed; any other check's flag a worker thread
reads once the reference is done. Either way only a failing check runs the full comparison, on
the worker. On a GPU the calling thread launches the reference itself, right after the call:
launching is asynchronous, and a worker's Python launching it would take the interpreter lock
from the program at each of the reference's operators, each hand-over costing both threads
(measured: docs/PERFORMANCE.md). On the host, where running the reference is the
work itself, the worker runs it. A mismatch is reported (`on_mismatch`, by default one line on
stderr) and written, rate-limited, as a one-call snapshot that `replay run` replays.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import inspect
import itertools
import logging
import math
import os
import queue
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

from replay import recorder, settings
from replay import metrics
from replay.compare import Comparison, agreement, compare, row_ranges
from replay.errors import ReplayError
from replay.recorder import cuda_streams
from replay.recorder.staging import CallSpec, bind
from replay.context import recorder_work, returned_values, tag
from replay.registry import Op
from replay.snapshot.files import safe_component
from replay.verify import gate, reference_graphs
from replay.verify.gate import StatsFeed
from replay.verify.reference_graphs import Graph, ReferenceGraphs, copy_into, kind_of

log = logging.getLogger(__name__)

COMPILE_MODES = ("break", "skip")
KEEP_BYTES = 1 << 20  # read-only inputs this large are not copied for a check (see _read_in_place)
COUNTERS = ("calls", "checked", "flagged", "skipped", "dropped", "failed", "snapshots", "abandoned", "unscored")
WINDOW = 16  # calls of an op checked after the gate found one unusual
# Device types whose checks the calling thread launches (the worker then only reads the verdict);
# tests add "cpu" to run the same logic on the host
CALLER_LAUNCHES = ("cuda",)


@dataclass
class Settings:
    enabled: bool = True
    directory: Path = field(default_factory=lambda: Path(settings.VERIFY_DIR.get()))
    max_snapshots: int = 3  # per op, each time it is verified anew: later mismatches are counted, not written
    compile: str = "break"  # under torch.compile: a graph break around the check, or skip and count
    queue_depth: int = 64
    # memory the pending checks may hold (their copies, and the outputs of references launched by
    # the calling thread); past it a call is not checked (dropped): a large op's checks, sixteen in a
    # window, would otherwise take the program's device memory
    max_pending_bytes: int = 1 << 30
    gate_budget: float = gate.BUDGET  # the program's time that gates of outliers=True may take (gate.budgeted_share)


@dataclass
class Mismatch:
    """What on_mismatch receives."""
    op: str
    variant: str
    call: int
    output: str
    rows: list[int]
    max_abs: float  # over the elements where both sides are finite
    snapshot: Path | None
    unwritten: str | None = None  # why the snapshot could not be written
    mismatches: int = 0  # elements outside the tolerance (NaN or infinity against a number among them)
    numel: int = 0
    first: str = ""  # 'first at [1, 3]: nan vs 1.0'
    problem: str = ""  # what makes the output incomparable (its shape, its type)
    metric: str = ""  # 'nmse 3.2e-05 (bound 1e-06)', where the op's metric decided

    def line(self) -> str:
        what = f"rows {row_ranges(self.rows)} of '{self.output}' differ" if self.rows else f"'{self.output}' differs"
        elements = f" in {self.mismatches}/{self.numel} elements" if self.mismatches and not self.problem else ""
        details = [self.problem] if self.problem else \
            [text for text in (self.first, self.metric) if text] + [f"max error {self.max_abs:.3g}"]
        saved = f"; snapshot {self.snapshot}" if self.snapshot else \
            f"; the snapshot could not be written: {self.unwritten}" if self.unwritten else \
            "; no snapshot (the limit per op is reached)"
        return (f"replay.verify: {self.op} ({self.variant}) call {self.call}: {what} from the reference{elements} "
                f"({'; '.join(details)}){saved}")


@dataclass
class _Check:
    policy: "Policy"
    spec: CallSpec
    number: int
    signature: inspect.Signature
    inputs: dict[str, Any]  # copies of the bound arguments, taken before the call (see _read_in_place)
    kept: dict[str, int]  # the inputs not copied, the program's own tensors: their version counters
    after: dict[str, Any]  # the kernel's outputs and mutated arguments, copied after it
    result: Any
    device: int | None  # the CUDA device of its tensors; None on the host
    copied: Any  # the event after which its copies are in place (a GPU)
    finished: Any  # the event its reference's work records once issued (a GPU)
    launched: "_Launched | None" = None  # its reference's work, once launched (_launch)
    failure: Exception | None = None  # launching it on the calling thread raised: the worker reports it
    nbytes: int = 0  # what it holds until the worker is done with it (Settings.max_pending_bytes)
    graph: Graph | None = None  # its kind's graph, whose statics hold its copies (reference_graphs.py)


@dataclass
class _Launched:
    """A check's reference launched: what it returned (with the op's mutated arguments as it left
    them), the outputs compared, the device's verdict on each (None: decided on the host), and the
    event after it all (a GPU)."""
    expected: dict[str, Any]
    compared: list[tuple[str, torch.Tensor, torch.Tensor]]
    verdicts: list[torch.Tensor | None]
    done: Any
    agreed: np.ndarray | None = None  # a graph's verdict on every output, in host memory (reference_graphs.py)


class _Scheduling:
    """A Policy's field that decides which calls the verifier takes: setting it sets `until` again."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = "_" + name

    def __get__(self, policy: "Policy | None", owner: type | None = None) -> Any:
        return self if policy is None else getattr(policy, self._name)

    def __set__(self, policy: "Policy", value: int) -> None:
        # program threads set these at once (a sampled call's schedule, a gate's window): `until`
        # worked out from one field's old value would let the calls of an open window go unchecked
        with policy._scheduling:
            setattr(policy, self._name, value)
            policy._set_until()


class Policy:
    """How one op's calls are verified: its reference and tolerance, the sampling schedule, the
    gate's feed and the window of calls still to check after an unusual one."""

    def __init__(self, op: Op, sample: float, on_mismatch: Callable[[Mismatch], None] | None,
                 outliers: bool | float):
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"replay.verify: sample={sample!r} must be a share of calls, 0 to 1")
        share = float(outliers) if isinstance(outliers, (bool, int, float)) else -1.0
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"replay.verify: outliers={outliers!r}: True, False, or the share of calls the gate "
                             "reads, 0 to 1")
        # True: the share follows the gates' time budget (Verifier._rebudget), from every call read
        self.budgeted = outliers is True
        if "reference" not in op.variants:
            raise ValueError(f"replay.verify: op '{op.name}' has no reference variant to check against")
        self.op, self.on_mismatch = op, on_mismatch
        self.gate_share = share  # the share of calls the gate reads (0: no gate)
        self.numbers = itertools.count()  # next() is atomic: threads never share a call number
        # the calls before number `until` need neither the gate nor a check: what the wrapper of a
        # verified function compares a call's number with, before anything else (intercept.py);
        # kept from the three below, each set through a _Scheduling
        self.until = 0
        self._scheduling = threading.Lock()
        self._next_note = sys.maxsize  # the number of the next call the gate reads (Verifier.schedule_note)
        self._window = 0  # calls still to check because the gate found an earlier one unusual
        self._next_sample = 0  # the number of the next sampled call (Verifier.schedule)
        self.feed: StatsFeed | None = None  # set by Verifier.hook when the gate is on
        self._sample = sample
        self.snapshots = 0  # mismatch snapshots written (Settings.max_snapshots)
        # a call past `until`, its number drawn: (number, spec, call, signature, args, kwargs) -> result
        self.resume: Callable[..., Any] | None = None  # set by Verifier.hook

    next_note = _Scheduling()
    next_sample = _Scheduling()
    window = _Scheduling()

    def _set_until(self) -> None:
        self.until = min(self._next_note, self._next_sample) if self._window <= 0 else 0

    @property
    def sample(self) -> float:
        return self._sample

    def calls(self) -> int:
        """Calls numbered so far (itertools.count shows its next value only in its repr)."""
        return int(repr(self.numbers)[len("count("):-1])

    def open_window(self, number: int) -> None:
        """The gate found call `number` unusual: check the next WINDOW calls, from the call in flight."""
        self.window = WINDOW


class Verifier:
    """The process's verification state: settings, counters, the queue and its worker thread."""

    def __init__(self) -> None:
        self.settings = Settings()
        self.counters = dict.fromkeys(COUNTERS, 0)  # "calls" is kept by the policies: see counts()
        self._lock = threading.Lock()
        self._random = random.Random()
        self._queue: queue.Queue[_Check] | None = None
        # checks whose graph's verdict lands in host memory: read by the program's thread once their
        # event has passed (asked, never waited for), without a hand-over to the worker (_land)
        self._landed: collections.deque[_Check] = collections.deque()
        # graphs of calls that raised after their copies were queued: given back once those have run
        self._held_back: list[Graph] = []
        self._worker: threading.Thread | None = None
        self._cuda_streams: dict[int, Any] = {}  # per CUDA device: see _reference_stream_on
        self._policies: list[Policy] = []
        self._retired_calls = 0
        self._pending_bytes = 0  # held by the checks submitted and not yet done (_Check.nbytes)
        self.graphs = ReferenceGraphs()
        self._reference_stream = threading.RLock()  # held while a thread issues work on a reference stream

    @functools.cached_property
    def _launch_eagerly(self) -> Callable[[_Check], None]:
        """The calling thread's launch, never traced: torch.compile's graph break around a checked
        call (_call) would otherwise trace the reference too. Made at the first check: wrapping
        imports torch._dynamo (~1 s), which every `replay` command would pay at `import replay`.
        Outside compiled code (no frame callback of torch.compile's set) the launch is called as
        it is: the wrapper's own turns cost a check ~10 us."""
        disabled = torch.compiler.disable(self._launch)
        callback = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", None)
        if callback is None:
            return disabled
        launch = self._launch

        def eagerly(check: _Check) -> None:
            (launch if callback() is None else disabled)(check)
        return eagerly

    def seed(self, seed: int) -> None:
        """Make the sampling repeatable (tests)."""
        self._random.seed(seed)
        for policy in self._policies:
            self.schedule(policy, policy.calls() - 1)
            if policy.feed is not None:
                self.schedule_note(policy, policy.calls() - 1)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            calls = self._retired_calls + sum(policy.calls() for policy in self._policies)
            return {**self.counters, "calls": calls}

    def schedule(self, policy: Policy, after: int, sample: float | None = None) -> None:
        """Pick the next sampled call after call `after`: gaps between sampled calls are geometric,
        so a call is sampled with probability `sample` and an unsampled one costs a comparison."""
        if sample is not None:
            policy._sample = sample
        policy.next_sample = self._after_gap(after, policy.sample)

    def schedule_note(self, policy: Policy, after: int) -> None:
        """Pick the next call the gate reads after call `after`. With a share of 1 every call is read:
        the next is 0 for good, so that threads taking numbers out of order skip none."""
        policy.next_note = 0 if policy.gate_share >= 1.0 else self._after_gap(after, policy.gate_share)

    def _after_gap(self, after: int, p: float) -> int:
        """The next call after `after` chosen with probability `p`: gaps are geometric."""
        gap = 0 if p >= 1.0 else sys.maxsize if p <= 0.0 else \
            int(math.log(1.0 - self._random.random()) / math.log(1.0 - p))
        return min(after + 1 + gap, sys.maxsize)

    def retire(self, policy: Policy) -> None:
        """`policy` is no longer used: its calls stay counted, its gate's batches are scored (none
        is left on the device writing into its buffers)."""
        with self._lock:
            if policy in self._policies:
                self._policies.remove(policy)
                self._retired_calls += policy.calls()
        if policy.feed is not None:
            policy.feed.flush()
        self._read_landed_safely()  # what is done is counted now, not at some other op's next check

    # the call path ------------------------------------------------------------------------------

    def hook(self, policy: Policy) -> Callable[..., Any]:
        """What the recorder calls instead of the op's variant while the op is verified. An
        unchecked call costs a counter, two comparisons and the call, plus, with the gate on, its
        arguments noted (and every BATCH calls one launch); nothing on this path waits for the
        device."""
        if policy.gate_share > 0:
            policy.feed = StatsFeed(policy.open_window, self.count)
            self.schedule_note(policy, -1)
        self.schedule(policy, -1)
        with self._lock:
            self._policies.append(policy)
        compiled = torch.compiler.disable(self._call, recursive=False)  # a graph break around the check
        noted = self._noted
        settings, numbers = self.settings, policy.numbers
        is_compiling = torch.compiler.is_compiling

        def verified(spec: CallSpec, call: Callable[..., Any], signature: inspect.Signature, args: tuple,
                     kwargs: dict) -> Any:
            if is_compiling():
                if settings.compile == "skip":
                    self.count("skipped")  # counted when traced: a compiled graph holds no Python
                    return call(*args, **kwargs)
                return compiled(policy, spec, call, signature, args, kwargs)
            number = next(numbers)
            if number < policy.until:
                return call(*args, **kwargs)  # the common case: no statistics, no check
            return noted(policy, number, spec, call, signature, args, kwargs)

        policy.resume = functools.partial(noted, policy)
        # the wrapper of a verified function with parameters of its own (intercept.py) reads the
        # policy itself: an unchecked call then runs no Python of the verifier's at all
        verified.policy = policy  # type: ignore[attr-defined]
        return verified

    def _call(self, policy: Policy, spec: CallSpec, call: Callable[..., Any], signature: inspect.Signature,
              args: tuple, kwargs: dict) -> Any:
        """A call under torch.compile ("break": here in a graph break), where speed is no concern."""
        return self._noted(policy, next(policy.numbers), spec, call, signature, args, kwargs)

    def _noted(self, policy: Policy, number: int, spec: CallSpec, call: Callable[..., Any],
               signature: inspect.Signature, args: tuple, kwargs: dict) -> Any:
        """A call past the fast path: noted for the gate (with one on), then run, checked or not."""
        if not self.settings.enabled:
            return call(*args, **kwargs)
        if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            self.count("skipped")  # nothing may be issued into a graph being captured
            return call(*args, **kwargs)
        feed = policy.feed
        batch_due = False
        if feed is not None and number >= policy.next_note:
            self.schedule_note(policy, number)
            batch_due = feed.observe(number, args, kwargs)
        result = self._route(policy, number, spec, call, signature, args, kwargs)
        if feed is not None and batch_due:
            feed.close()  # after the call: what it wrote is read as written
            if policy.budgeted:
                self._rebudget()
        return result

    def _rebudget(self) -> None:
        """Set the share of calls the budgeted gates read from what each measured it costs
        (gate.budgeted_share); each draws its next read with it (schedule_note, at its next read)."""
        budgeted = [(policy, policy.feed) for policy in list(self._policies)
                    if policy.budgeted and policy.feed is not None]
        share = gate.budgeted_share((feed.rate for _, feed in budgeted), self.settings.gate_budget)
        for policy, _ in budgeted:
            policy.gate_share = share

    def _route(self, policy: Policy, number: int, spec: CallSpec, call: Callable[..., Any],
               signature: inspect.Signature, args: tuple, kwargs: dict) -> Any:
        """Run the call, checked if it is sampled or in a window the gate opened."""
        if number >= policy.next_sample:
            self.schedule(policy, number)
        elif policy.window > 0:
            policy.window -= 1  # two threads may take the last one: then it reads as closed
        else:
            return call(*args, **kwargs)
        if self._landed or self._held_back:
            self._read_landed_safely()
        if self._full():
            self.count("dropped")
            return call(*args, **kwargs)
        return self._checked(policy, number, spec, call, signature, args, kwargs)

    def _checked(self, policy: Policy, number: int, spec: CallSpec, call: Callable[..., Any],
                 signature: inspect.Signature, args: tuple, kwargs: dict) -> Any:
        """Run a checked call: its inputs copied before it and its outputs after, on the program's
        own stream (the program would wait for copies made elsewhere anyway: the call may write
        its inputs, and the program what the call returned), never waiting for a reference; the
        check queued."""
        arguments, mutates = bind(signature, args, kwargs), policy.op.mutates
        in_place = {name for name, value in arguments.items() if _read_in_place(name, value, mutates)}
        device = _cuda_device(arguments.values())
        graph = self._graph_for(policy, arguments, device, in_place)
        check = None
        try:
            copies = _copies({name: value for name, value in arguments.items() if name not in in_place},
                             graph, "inputs")
            inputs = {name: copies.get(name, value) for name, value in arguments.items()}  # in the call's order
            kept = {name: arguments[name]._version for name in in_place}
            result = call(*args, **kwargs)
            outputs = returned_values(result, policy.op.outputs)
            outputs.update((name, arguments[name]) for name in mutates if name in arguments)
            after = _copies(outputs, graph, "after")
            copied, finished = None, None
            if device is not None:
                copied, finished = _events(graph)
                copied.record(cuda_streams.current(device))
            # the result's shape holding the copies: a check never keeps the program's outputs alive
            check = _Check(policy, spec, number, signature, inputs, kept, after,
                           _as_returned(result, after, policy.op.outputs), device, copied, finished, graph=graph)
            if _device_type(device) in CALLER_LAUNCHES:
                try:
                    self._launch_eagerly(check)
                except Exception as exc:  # a reference that raises: reported, never the program's problem
                    # by the worker, once what it launched is done with the copies; without its traceback,
                    # which would hold the program's frames (and their tensors) until then
                    check.failure = exc.with_traceback(None)
                    exc.__context__ = exc.__cause__ = None
            if check.graph is None or check.graph.unfit:  # a graph's statics count with its memory (GRAPH_BYTES)
                check.nbytes = _tensor_bytes(value for name, value in inputs.items() if name not in kept) + \
                    _tensor_bytes(after.values()) + (_tensor_bytes(check.launched.expected.values())
                                                     if check.launched else 0)
            # a check reading a program's tensor in place goes to the worker, which looks at its version
            # as soon as the reference is done: a write after that is no reason to skip it
            landed = not kept and check.failure is None and check.launched is not None and \
                check.launched.agreed is not None
            if landed:
                self._land(check)  # queued last: from here its reader gives the graph back
            else:
                self._submit(check)
        except BaseException:  # the call raised (or an interrupt came): no check, and the graph goes back
            held = check.graph if check is not None else graph
            if held is not None:
                self._release_after_copies(held, device)
            raise
        return result

    def _release_after_copies(self, graph: Graph, device: int | None) -> None:
        """Give back the graph of a check that ended at its call: on a GPU once the copies queued
        into its statics have run (an event, asked at later checks and drains), as the next check
        of its kind rewrites the table those copies read (gather_copy.FixedCopies)."""
        if device is None:
            self.graphs.release(graph)
            return
        try:
            copied, _ = _events(graph)
            copied.record(cuda_streams.current(device))
        except Exception:  # no event: the graph is forgotten, never reused (its tensors go with it)
            graph.unfit = True
            self.graphs.release(graph)
            return
        with self._lock:
            self._held_back.append(graph)

    def _give_back_held(self) -> None:
        """Give back the held-back graphs whose copies have run (asked, never waited for)."""
        with self._lock:
            done = [graph for graph in self._held_back if graph.events is None or graph.events[0].query()]
            self._held_back = [graph for graph in self._held_back if graph not in done]
        for graph in done:
            self.graphs.release(graph)

    def _graph_for(self, policy: Policy, arguments: dict[str, Any], device: int | None,
                   in_place: set[str]) -> Graph | None:
        """The graph of this check's kind, taken (reference_graphs.py), where its reference is
        launched by the calling thread on a device that has graphs."""
        if _device_type(device) not in CALLER_LAUNCHES or _device_type(device) not in reference_graphs.GRAPH_DEVICES:
            return None
        op = policy.op
        kind = kind_of(op.name, arguments, _device_type(device), in_place)
        return self.graphs.take(op.name, kind, (op, op.get("reference").fn, dict(op.tolerance), op.metric))

    def _reference_stream_on(self, device: int) -> Any:
        """The verifier's stream on a CUDA device, where references run (so that the program never
        waits for one)."""
        stream = self._cuda_streams.get(device)
        if stream is None:
            with self._lock:  # the program's thread and the worker may ask first at once
                stream = self._cuda_streams.setdefault(device, torch.cuda.Stream(device))
        return stream

    def _full(self) -> bool:
        """Whether `queue_depth` checks are pending, or they hold `max_pending_bytes`: a call
        routed now is not checked (dropped)."""
        pending = len(self._landed) + (self._queue.qsize() if self._queue is not None else 0)
        return pending >= self.settings.queue_depth or self._pending_bytes >= self.settings.max_pending_bytes

    def _submit(self, check: _Check) -> None:
        """Queue a check for the worker. The queue itself has no bound: a check whose reference
        was launched must reach the worker, which holds its copies until the reference is done
        with them; _full() keeps to `queue_depth` (threads racing past it add one each)."""
        with self._lock:
            if self._worker is None:
                self._queue = queue.Queue()
                self._worker = threading.Thread(target=self._run, name="replay-verify", daemon=True)
                self._worker.start()
            self._pending_bytes += check.nbytes
        assert self._queue is not None
        self._queue.put_nowait(check)

    def _land(self, check: _Check) -> None:
        """Keep a check whose verdict its graph copies into host memory, for the program's thread
        to read at its next checked call (of any op), a drain or a `stop`, once the reference is
        done. Handing every check to the worker cost the program the worker's turns with the
        interpreter lock: two a check (it wakes, and its wait for the reference ends), ~0.1 ms
        each on an H200 host."""
        with self._lock:
            self._landed.append(check)
            self._pending_bytes += check.nbytes

    def _read_landed(self, deadline: float | None = None) -> None:
        """Finish the landed checks whose reference is done; with a `deadline` (a drain), wait for
        the others until then, else leave them (nothing here waits for the device). A verdict
        that some output disagrees goes to the worker, which compares in full and reports. Graphs
        held back (_release_after_copies) whose copies have run are given back first (a drain
        waits for them too)."""
        while self._held_back:
            self._give_back_held()
            if not self._held_back or deadline is None or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        while self._landed:
            with self._lock:
                ready = [check for check in self._landed if _reference_done(check)]
                for check in ready:
                    self._landed.remove(check)
                    self._pending_bytes -= check.nbytes
            for check in ready:
                self._finish_landed(check)
            if not self._landed or deadline is None or time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def _read_landed_safely(self, deadline: float | None = None) -> None:
        try:
            self._read_landed(deadline)
        except Exception as exc:  # never the program's problem (nor a drain's): said, and the program goes on
            log.warning(f"replay.verify: reading a check's verdict failed: {type(exc).__name__}: {exc}")

    def _finish_landed(self, check: _Check) -> None:
        """A landed check whose reference is done: counted and its graph given back, or handed to
        the worker (which then gives it back) when its verdict is that some output disagrees."""
        handed = False
        try:
            assert check.launched is not None and check.launched.agreed is not None
            if not check.launched.agreed:
                self._submit(check)
                handed = True
            else:
                self.count("checked")
        finally:
            if not handed and check.graph is not None:
                self.graphs.release(check.graph)

    # the worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            check = self._queue.get()
            try:
                self._check(check)
            except Exception as exc:  # a reference that raises: reported, never the program's problem
                _check_failed(check, exc)
            finally:
                if check.graph is not None:
                    self.graphs.release(check.graph)
                with self._lock:
                    self._pending_bytes -= check.nbytes
                self._queue.task_done()
                del check  # its copies go now, not when the next check comes

    def _launch(self, check: _Check) -> None:
        """Run the reference on the check's copies, on the verifier's reference stream once the
        copies are in place, and reduce the comparison there (nothing is read back here): one
        replay of the kind's graph where it has one (captured here at its second check), else
        eagerly. As a thread of its own would: whatever the calling thread has set (autocast, grad
        mode, dispatch modes) left out, and never traced by torch.compile (see _launch_eagerly).
        One thread at a time uses the reference stream: a capture on it must hold nothing of
        another thread's."""
        with self._reference_stream:
            stream = self._reference_stream_on(check.device) if check.device is not None else None
            if stream is not None:
                stream.wait_event(check.copied)
            graph = check.graph
            with _issuing_on(stream):
                if graph is None or graph.unfit:
                    result = self._reference(check)
                else:
                    try:
                        if graph.replay is None:
                            reference_graphs.capture(graph, lambda: self._reference(check), cuda=stream is not None)
                            self.graphs.captured(graph)
                        assert graph.replay is not None and graph.result is not None
                        graph.replay()
                    except Exception:  # the reference cannot be captured (or replayed): eagerly, from now on
                        self._uncapturable(check)
                        return self._launch(check)
                    result = graph.result
                done = None
                if stream is not None:
                    done = check.finished
                    done.record(stream)
        check.launched = _Launched(*result, done, graph.agreed if graph is not None and not graph.unfit else None)

    def _uncapturable(self, check: _Check) -> None:
        """The check's reference could not be captured: its op is checked eagerly from now on;
        this check too runs eagerly (its graph goes, its statics stay its copies)."""
        graph, check.graph = check.graph, None
        self.graphs.uncapturable(check.policy.op.name)
        if graph is not None:
            self.graphs.release(graph)

    def _reference(self, check: _Check) -> reference_graphs.Result:
        """The op's reference on the check's inputs and the device's verdict on each output, on
        the current stream: the expected outputs (with the op's mutated arguments as it left them),
        the outputs compared, and a verdict each (None: decided on the host)."""
        op = check.policy.op
        with torch.no_grad(), torch.autocast(_device_type(check.device), enabled=False), \
                _disable_current_modes(), recorder_work():  # its operators are no calls of the program either
            # the op's mutated arguments are copied again: the snapshot of a mismatch needs them as they came in
            arguments = {name: _copy(value) if name in op.mutates else value for name, value in check.inputs.items()}
            bound = inspect.BoundArguments(check.signature, arguments)
            expected = returned_values(op.get("reference").fn(*bound.args, **bound.kwargs), op.outputs)
            expected.update({name: arguments[name] for name in op.mutates if name in arguments})
            compared = [(name, got, expected[name]) for name, got in check.after.items()
                        if isinstance(got, torch.Tensor) and isinstance(expected.get(name), torch.Tensor)]
            return expected, compared, [_agrees(op, got, want) for _, got, want in compared]

    def _check(self, check: _Check) -> None:
        """On the worker: the reference run (here, where the calling thread did not launch it),
        waited for, and its verdict read."""
        try:
            if check.failure is not None:
                raise check.failure
            if check.launched is None:
                self._launch(check)
        finally:
            if check.launched is not None and check.launched.done is not None:
                check.launched.done.synchronize()  # this thread's wait, never the program's
            elif check.device is not None:  # a launch that failed part-way: its work is let finish first
                with self._reference_stream:  # never while another thread captures on it
                    self._reference_stream_on(check.device).synchronize()
        launched = check.launched
        assert launched is not None  # launched above, or the launch raised
        # looked at once the reference has read them: the program wrote to an argument that was not
        # copied, before or while the reference ran, so the values the call saw are gone
        if any(check.inputs[name]._version != version for name, version in check.kept.items()):
            self.count("skipped")
            return
        self.count("checked")
        if launched.agreed is not None and bool(launched.agreed):
            return  # every output agrees: the graph's verdict, read from host memory
        flags = [v for v in launched.verdicts if v is not None]
        if len(flags) == len(launched.verdicts) and len({v.device for v in flags}) <= 1 and \
                (not flags or bool(torch.stack(flags).all())):
            return  # every output agrees: one flag read back, no element
        op, expected = check.policy.op, launched.expected
        for name, got, want in launched.compared:
            comparison = compare(got, want, op.tolerance_for(got.dtype), op.batch_axes.get(name), same_dtype=False)
            if op.metric is not None:
                comparison.judged_by(op.metric)
            if not comparison.passed:
                self.count("failed")
                self._report(check, name, comparison, expected)
                return

    def _report(self, check: _Check, output: str, comparison: Comparison, expected: dict[str, Any]) -> None:
        policy = check.policy
        path, unwritten = None, None
        if policy.snapshots < self.settings.max_snapshots:  # only the worker reports: no race
            policy.snapshots += 1
            # the op's name shortened, never the part that tells two mismatches apart
            path = self.settings.directory / (f"{safe_component(policy.op.name, max_len=48)}-"
                                              f"{safe_component(check.spec.variant, max_len=24)}-call{check.number}-"
                                              f"{os.getpid()}-{time.time_ns()}")
            try:
                _write_snapshot(path, check, expected)
                self.count("snapshots")
            except (OSError, ReplayError, TypeError, ValueError, RuntimeError) as exc:  # the mismatch still counts
                shutil.rmtree(path, ignore_errors=True)  # a snapshot without its call is no use
                path, unwritten = None, f"{type(exc).__name__}: {exc}"
        mismatch = Mismatch(policy.op.name, check.spec.variant, check.number, output, comparison.bad_rows,
                            comparison.max_abs, path, unwritten, comparison.mismatches, comparison.numel,
                            comparison.first_difference(), comparison.problem or "", comparison.metric_value())
        if policy.on_mismatch is not None:
            policy.on_mismatch(mismatch)
        else:
            log.warning(mismatch.line())

    def drain(self, timeout: float = 10.0) -> int:
        """Let the gate score every call so far (a wait for the device), then wait up to `timeout`
        seconds for the checks queued; return how many are still pending (they go on), never
        waiting longer."""
        for policy in list(self._policies):
            if policy.feed is not None:
                policy.feed.flush()
        self._rebudget()  # a program that drains often closes its batches here
        deadline = time.monotonic() + timeout
        self._read_landed_safely(deadline)
        if self._queue is None:
            return len(self._landed)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._queue.unfinished_tasks + len(self._landed)


def _reference_done(check: _Check) -> bool:
    """Whether a launched check's reference is done (asked of its event, never waited for)."""
    assert check.launched is not None
    done = check.launched.done
    return done is None or bool(done.query())


def _as_returned(result: Any, after: dict[str, Any], outputs: tuple[str, ...]) -> Any:
    """`result`'s shape (a value, a tuple, a dict) holding the copies taken right after the call,
    not what the program may have done to the result since."""
    names = list(returned_values(result, outputs))
    if isinstance(result, dict):
        return {name: after.get(name, result[name]) for name in names}
    if isinstance(result, (tuple, list)):
        return type(result)(after.get(name, value) for name, value in zip(names, result))
    return after.get(names[0], result) if names else result


def _issuing_on(stream: Any) -> Any:
    """Work issued inside goes to `stream` (a CUDA stream), or where it would anyway (None)."""
    return cuda_streams.issuing_on(stream) if stream is not None else contextlib.nullcontext()


def _events(graph: Graph | None) -> tuple[Any, Any]:
    """A check's two CUDA events (its copies in place; its reference done): its graph's, made once
    (a graph serves one check at a time, and is given back only once both have passed), or new
    ones. Making an event costs its first record a driver call."""
    if graph is None:
        return torch.cuda.Event(), torch.cuda.Event()
    if graph.events is None:
        graph.events = (torch.cuda.Event(), torch.cuda.Event())
    return graph.events


def _device_type(device: int | None) -> str:
    """"cuda" for a check's CUDA device, "cpu" for a check on the host (None)."""
    return "cuda" if device is not None else "cpu"


def _cuda_device(values: Any) -> int | None:
    """The device of the first CUDA tensor among `values`, if any."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value.get_device()
    return None


def _tensor_bytes(values: Any) -> int:
    return sum(value.numel() * value.element_size() for value in values if isinstance(value, torch.Tensor))


def _copy(value: Any) -> Any:
    """A tensor's copy; anything else as it is."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _copies(values: dict[str, Any], graph: Graph | None, part: str) -> dict[str, Any]:
    """`values` with each tensor copied (into the graph's statics of that `part`, where a check has
    a graph: one launch for them all); anything else as it is."""
    if graph is None:
        return {name: _copy(value) for name, value in values.items()}
    tensors = {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}
    return {**values, **copy_into(graph, part, tensors)}


def _read_in_place(name: str, value: Any, mutates: tuple[str, ...]) -> bool:
    """Whether a checked call's input is read where it is rather than copied: a tensor of
    KEEP_BYTES or more that the op does not write (a weight) is kept as it is with its version
    counter, so a check costs no copy of it; the program writing to it before the check runs is
    seen there, and the check is skipped."""
    return (isinstance(value, torch.Tensor) and name not in mutates and not value.is_inference()
            and value.numel() * value.element_size() >= KEEP_BYTES)


def _check_failed(check: _Check, exc: Exception) -> None:
    log.warning(f"replay.verify: {check.spec.op} call {check.number}: the check failed: {type(exc).__name__}: {exc}")


def _write_snapshot(path: Path, check: _Check, expected: dict[str, Any]) -> None:
    """The call as a one-call snapshot: its inputs, its outputs as the kernel left them, and the
    reference's outputs as tags ('reference/<name>')."""
    spec, after = check.spec, check.after

    def replayed(*args: Any, **kwargs: Any) -> Any:
        bound = check.signature.bind(*args, **kwargs)
        for name in check.policy.op.mutates:
            if name in bound.arguments and isinstance(after.get(name), torch.Tensor):
                bound.arguments[name].copy_(after[name])  # as the kernel left it
        for name, value in expected.items():
            if isinstance(value, torch.Tensor):
                tag(f"reference/{name}", value)
        return _as_returned(check.result, after, check.policy.op.outputs)

    notes = f"replay.verify: call {check.number} of {spec.op} ({spec.variant}) differed from the reference"
    rec = recorder.Recording(path, recorder.RecordingOptions(notes=notes, asynchronous=False, tag_level=2, strict=True))
    try:
        bound = inspect.BoundArguments(check.signature, {n: _copy(v) for n, v in check.inputs.items()})
        rec.record(spec, replayed, check.signature, bound.args, bound.kwargs)
    finally:
        rec.close()


VERIFIER = Verifier()
recorder.before_graph_capture(VERIFIER.drain)  # the worker's CUDA calls would break the capture


def _report_at_exit() -> None:
    VERIFIER.count("abandoned", VERIFIER.drain())  # the checks the process ends without
    counted = VERIFIER.counts()
    if settings.VERIFY_REPORT.get() and counted["calls"]:
        log.warning("replay.verify: " + ", ".join(f"{k} {v}" for k, v in counted.items()))


atexit.register(_report_at_exit)


def _agrees(op: Op, got: torch.Tensor, want: torch.Tensor) -> torch.Tensor | None:
    """The device's verdict on one output, by the op's metric where it declares one (replay/metrics.py),
    else within its tolerance; None where shapes or devices differ (compare then says how)."""
    if op.metric is None or op.metric.name == "tolerance":
        return agreement(got, want, op.tolerance_for(got.dtype))
    if got.shape != want.shape or got.device != want.device or op.metric.name not in metrics.ON_DEVICE:
        return None  # decided on the host by compare (the worker's own wait, never the program's)
    return metrics.holds_on_device(op.metric, got, want)
