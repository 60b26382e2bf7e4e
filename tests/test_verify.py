"""replay.verify: a kernel wrong only for a rare input pattern is caught through the outlier gate
at a 1% sampling rate, and its snapshot replays with exit 1 naming the rows; no false alarm over
10,000 calls of a right kernel; torch.compile, threads, a drain that never hangs, run-time
configuration, REPLAY_VERIFY, and CUDA graph capture (GPU)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import replay
from replay import direct_launch
from replay.cli import main
from replay.verify import Mismatch
from replay.verify import call_stats
from replay.verify import gate as gate_module
from replay.verify.gate import BATCH, BATCHES, KINDS, WIDTH, KindGates
from replay.verify import verifier
from replay.verify.verifier import WINDOW, Policy

rowscale = replay.op("verify_rowscale", batch_axes={"x": 0, "out": 0})


@rowscale.reference
def rowscale_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.double() * scale).float()


@rowscale.batched
def rowscale_batched(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Right, except for rows holding a value over 50: there it adds 1 (a rare input pattern)."""
    spiked = x.abs().amax(dim=1, keepdim=True) > 50  # no data-dependent indexing: a CUDA graph can hold it
    return x * scale + spiked.to(x.dtype)


attend = replay.op("verify_attend", batch_axes={"x": 0, "out": 0})


@attend.reference
def attend_reference(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    return (x.double() + cache[:length].double().mean(dim=0) * positions.double()[:, None]).float()


@attend.batched
def attend_batched(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    return x + cache[:length].mean(dim=0) * positions[:, None]


@pytest.fixture
def verifying(tmp_path: Path) -> Iterator[Path]:
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True, compile="break")
    yield tmp_path / "mismatches"
    replay.verify.stop("verify_rowscale")
    replay.verify.drain()


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in replay.verify.counters().items()}


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# where a check's reference is launched: on a GPU the calling thread does it; on the host the
# worker does, unless the test moves it to the calling thread (the GPU's logic, run on the host)
LAUNCHERS = [("cpu", "worker"), ("cpu", "caller"), pytest.param("cuda", "caller", marks=pytest.mark.gpu)]


@pytest.fixture
def launched_by(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], None]:
    def choose(device: str, launcher: str) -> None:
        if device == "cpu" and launcher == "caller":
            monkeypatch.setattr(verifier, "CALLER_LAUNCHES", (*verifier.CALLER_LAUNCHES, "cpu"))
        assert (device in verifier.CALLER_LAUNCHES) == (launcher == "caller")
    return choose


@pytest.mark.parametrize(("device", "launcher"), LAUNCHERS)
def test_a_rare_wrong_pattern_is_caught_within_the_window_after_it_first_shows_and_replays_with_exit_1(
        device: str, launcher: str, launched_by: Callable[[str, str], None], verifying: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pattern (a spike in one row) first shows at call 500 and recurs every third call for a
    while: the gate's decision comes a few calls late, off this thread, and one of the WINDOW calls
    checked after it holds the spike."""
    launched_by(device, launcher)
    opened: list[int] = []  # how many calls the program had made when the window opened
    open_window = Policy.open_window
    monkeypatch.setattr(Policy, "open_window", lambda self, n: (opened.append(self.calls()), open_window(self, n)))
    found: list[Mismatch] = []
    replay.verify("verify_rowscale", sample=0.01, outliers=1.0, on_mismatch=found.append)
    gen = torch.Generator().manual_seed(1)
    before = replay.verify.counters()
    spiked = set(range(500, 3000, 3))
    for call in range(3000):
        x = torch.randn(8, 64, generator=gen)
        if call in spiked:
            x[3, 17] = 100.0
        rowscale_batched(x.to(device), 0.5)
        if found:
            break
    replay.verify.drain()
    assert found and found[0].rows == [3] and found[0].output == "out" and found[0].call in spiked
    assert opened and opened[0] > 500 and found[0].call < opened[0] + WINDOW  # decided late, caught in the window
    counted = delta(before)
    assert counted["flagged"] >= 1 and counted["checked"] < 100  # about 1% sampled, and windows until found
    snapshot = found[0].snapshot
    assert snapshot is not None and snapshot.parent == verifying, found[0].unwritten
    result = CliRunner().invoke(main, ["run", str(snapshot), "--provider", __name__])
    assert result.exit_code == 1, result.output
    assert "row 3" in result.output or "rows 3" in result.output


def test_the_gate_decides_late_and_the_calls_after_an_unusual_one_are_checked(verifying: Path) -> None:
    found: list[Mismatch] = []
    replay.verify("verify_rowscale", sample=0.0, outliers=1.0, on_mismatch=found.append)
    gen = torch.Generator().manual_seed(3)
    spike = torch.randn(8, 64, generator=gen)
    spike[5, 2] = -80.0
    before = replay.verify.counters()
    for _ in range(200):
        rowscale_batched(torch.randn(8, 64, generator=gen), 0.5)
    rowscale_batched(spike, 0.5)  # call 200: wrong, and unchecked: nothing is decided before it runs
    replay.verify.drain()  # the program goes on meanwhile; here the decision is let land
    assert delta(before)["flagged"] == 1 and delta(before)["checked"] == 0 and not found
    rowscale_batched(spike, 0.5)  # call 201: in the window
    for _ in range(BATCH - 1):  # calls 202-232: the rest of call 201's batch
        rowscale_batched(torch.randn(8, 64, generator=gen), 0.5)
    replay.verify.drain()
    for _ in range(WINDOW + 5):
        rowscale_batched(torch.randn(8, 64, generator=gen), 0.5)
    replay.verify.drain()
    counted = delta(before)
    assert [(m.call, m.rows) for m in found] == [(201, [5])]
    # calls 201-216 checked; call 201 was unusual too, so once its batch was decided (call 233 on)
    # WINDOW calls more
    assert counted["flagged"] == 2 and counted["checked"] == 2 * WINDOW


def test_a_gate_reading_a_share_of_calls_reads_about_that_share_and_still_catches_a_recurring_pattern(
        verifying: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """outliers=0.25: the gate reads a quarter of the calls (chosen at random); the pattern that
    comes back every third call from call 500 on is read a few calls later, and caught in the
    window it opens."""
    read: list[int] = []
    observe = gate_module.StatsFeed.observe
    monkeypatch.setattr(gate_module.StatsFeed, "observe",
                        lambda self, number, args, kwargs: (read.append(number), observe(self, number, args, kwargs))[1])
    found: list[Mismatch] = []
    replay.verify("verify_rowscale", sample=0.0, outliers=0.25, on_mismatch=found.append)
    gen = torch.Generator().manual_seed(1)
    spiked = set(range(500, 4000, 3))
    for call in range(4000):
        x = torch.randn(8, 64, generator=gen)
        if call in spiked:
            x[3, 17] = 100.0
        rowscale_batched(x, 0.5)
        if found:
            break
    replay.verify.drain()
    assert found and found[0].rows == [3] and found[0].call in spiked
    made = call + 1  # the loop went on while the worker found it
    assert 0.18 * made < len(read) < 0.32 * made and len(set(read)) == len(read)


@pytest.mark.parametrize("outliers", [1.5, -0.25, "often", None])
def test_the_gates_share_must_be_a_share(outliers: object) -> None:
    with pytest.raises(ValueError, match="outliers="):
        replay.verify("verify_rowscale", outliers=outliers)  # type: ignore[arg-type]


def test_a_gate_reading_no_call_is_no_gate(verifying: Path) -> None:
    replay.verify("verify_rowscale", sample=0.0, outliers=0.0)
    before = replay.verify.counters()
    for _ in range(300):
        rowscale_batched(torch.randn(8, 64), 0.5)
    replay.verify.drain()
    assert verifier.VERIFIER._policies[-1].feed is None and delta(before)["checked"] == 0


def replay_python_called(fn: Callable[[], object]) -> list[str]:
    """The Python functions of the replay package that `fn` calls, by name, in order."""
    called: list[str] = []
    package = str(Path(replay.__file__).parent)

    def profile(frame, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(package):
            called.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return called


def test_an_unchecked_call_of_a_verified_op_runs_no_python_of_the_verifiers(verifying: Path,
                                                                           tmp_path: Path) -> None:
    # the wrapper compares the call's number with the policy's `until` itself (intercept.py): the
    # verifier's hook runs only for calls it checks or the gate reads
    x = torch.randn(8, 64)
    replay.verify("verify_rowscale", sample=0.0, outliers=False)
    assert replay_python_called(lambda: rowscale_batched(x, 0.5)) == []
    policy = verifier.VERIFIER._policies[-1]
    policy.next_sample = policy.calls()  # the next call is sampled: the hook takes it, numbered
    before = replay.verify.counters()
    rowscale_batched(x, 0.5)
    replay.verify.drain()
    assert delta(before)["checked"] == 1 and policy.until > policy.calls()
    policy.window = 2  # a window the gate opened: the next two are checked, the one after is not
    before = replay.verify.counters()
    for _ in range(3):
        rowscale_batched(x, 0.5)
    replay.verify.drain()
    assert delta(before)["checked"] == 2 and policy.window == 0
    assert replay_python_called(lambda: rowscale_batched(x, 0.5)) == []
    with replay.recording(tmp_path / "recorded"):  # a recording takes every call, verified or not
        assert "record" in replay_python_called(lambda: rowscale_batched(x, 0.5))
    assert replay_python_called(lambda: rowscale_batched(x, 0.5)) == []


def test_a_window_opened_while_another_thread_schedules_keeps_its_calls_checked() -> None:
    # one program thread schedules its next sampled call while another's gate opens a window: the
    # policy's `until` (what the op's wrapper compares a call's number with) must never be left as
    # worked out from the window's old value, or the window's calls would all go unchecked
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        stale = 0
        for _ in range(100):
            policy = Policy(rowscale, 0.01, None, False)
            policy.next_sample = 10 ** 9
            stop = threading.Event()

            def schedule(policy: Policy = policy, stop: threading.Event = stop) -> None:
                n = 0
                while not stop.is_set():
                    policy.next_sample = 10 ** 9 + n
                    n += 1
            thread = threading.Thread(target=schedule)
            thread.start()
            for _ in range(200):  # windows opened and run out
                policy.window = WINDOW
                policy.window = 0
            policy.window = WINDOW
            stop.set()
            thread.join()
            stale += policy.until != 0
    finally:
        sys.setswitchinterval(switch)
    assert stale == 0


def test_no_false_alarm_over_ten_thousand_calls_of_a_right_kernel(verifying: Path) -> None:
    @replay.verify(reference=lambda x, w: (x.double() @ w.double()).float(), sample=0.01)
    def right_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 32, generator=gen)
    before = replay.verify.counters()
    for _ in range(10_000):
        right_matmul(torch.randn(8, 64, generator=gen), w)
    replay.verify.drain(60)
    counted = delta(before)
    assert counted["calls"] == 10_000 and counted["failed"] == 0 and counted["checked"] >= 50
    replay.verify.stop("test_no_false_alarm_over_ten_thousand_calls_of_a_right_kernel.<locals>.right_matmul")


def test_a_large_weight_is_not_copied_and_a_check_it_outlived_is_skipped(verifying: Path) -> None:
    """A 1 MiB weight the op does not write is handed to the check as it is: written by the
    program before the check ran, the check is skipped (never compared against new values)."""
    worker_may_go = threading.Event()
    found: list[Mismatch] = []

    def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        worker_may_go.wait(30)
        return x @ w

    @replay.verify(reference=reference, sample=1.0, outliers=False, on_mismatch=found.append)
    def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    w = torch.ones(512, 512)  # 1 MiB of float32
    x = torch.ones(2, 512)
    before = replay.verify.counters()
    matmul(x, w)  # checked once the worker may go: w unchanged
    matmul(x, w)
    w.mul_(2.0)  # before the checks ran: the first two saw w as it was, but kept no copy of it
    matmul(x, w)  # this one's check sees w as it was when it ran
    worker_may_go.set()
    replay.verify.drain()
    counted = delta(before)
    assert counted["skipped"] == 2 and counted["checked"] == 1 and counted["failed"] == 0 and not found
    replay.verify.stop(matmul.__replay_spec__.op)


@pytest.mark.parametrize("mode", ["break", "skip"])
def test_under_torch_compile_checks_break_the_graph_or_are_skipped(mode: str, verifying: Path) -> None:
    replay.verify("verify_rowscale", sample=1.0)
    replay.verify.configure(compile=mode)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: rowscale_batched(x, 2.0) + 1, backend="eager")
    before = replay.verify.counters()
    for _ in range(3):
        out = compiled(torch.ones(4, 8))
    replay.verify.drain()
    assert torch.equal(out, torch.full((4, 8), 3.0))
    counted = delta(before)
    if mode == "break":
        assert counted["checked"] == 3 and counted["skipped"] == 0
    else:
        assert counted["checked"] == 0 and counted["skipped"] >= 1


@pytest.mark.parametrize("launcher", ["worker", "caller"])
def test_threads_call_a_verified_op_at_once(launcher: str, launched_by: Callable[[str, str], None],
                                            verifying: Path) -> None:
    launched_by("cpu", launcher)
    replay.verify("verify_rowscale", sample=0.2)
    before = replay.verify.counters()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        try:
            for _ in range(300):
                rowscale_batched(torch.randn(4, 16, generator=gen), 3.0)
        except BaseException as exc:  # noqa: BLE001 (collected for the assertion)
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    replay.verify.drain()
    counted = delta(before)
    assert not errors and counted["calls"] == 1200 and counted["failed"] == 0
    assert counted["checked"] + counted["dropped"] >= 150


def test_on_the_calling_threads_path_the_reference_runs_there_and_the_worker_reads_the_verdict(
        launched_by: Callable[[str, str], None], verifying: Path) -> None:
    """The GPU's path, on the host: the calling thread runs the reference right after the call;
    the worker reads the verdict, and a mismatch is reported, written and replayed as always."""
    launched_by("cpu", "caller")
    ran_on: list[int] = []
    found: list[Mismatch] = []

    def reference(x: torch.Tensor) -> torch.Tensor:
        ran_on.append(threading.get_ident())
        return x + 1

    @replay.verify(reference=reference, sample=1.0, outliers=False, on_mismatch=found.append)
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1 + (x > 5).to(x.dtype)  # wrong where an element is over 5

    before = replay.verify.counters()
    assert torch.equal(add_one(torch.zeros(3, 4)), torch.ones(3, 4))
    spiked = torch.zeros(3, 4)
    spiked[2, 1] = 9.0
    add_one(spiked)
    replay.verify.drain()
    counted = delta(before)
    assert ran_on == [threading.get_ident()] * 2 and counted["checked"] == 2 and counted["failed"] == 1
    assert len(found) == 1 and found[0].call == 1 and found[0].max_abs == 1.0 and found[0].snapshot is not None
    replay.verify.stop(add_one.__replay_spec__.op)


def test_a_reference_that_raises_on_the_calling_thread_is_reported_never_raised(
        launched_by: Callable[[str, str], None], verifying: Path, said: Callable[[], list[str]]) -> None:
    launched_by("cpu", "caller")

    def reference(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the reference is broken")

    @replay.verify(reference=reference, sample=1.0, outliers=False)
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    said()
    before = replay.verify.counters()
    assert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))
    replay.verify.drain()
    assert delta(before)["checked"] == 0
    assert any("call 0: the check failed: RuntimeError: the reference is broken" in line for line in said())
    replay.verify.stop(double.__replay_spec__.op)


def test_the_calling_threads_settings_do_not_reach_the_reference(launched_by: Callable[[str, str], None],
                                                                  verifying: Path) -> None:
    """Autocast, grad mode and dispatch modes are the calling thread's own: a reference launched
    there runs as on a thread of its own, in the precision it asks for, recording no graph."""
    launched_by("cpu", "caller")
    seen: list[tuple[bool, bool]] = []
    found: list[Mismatch] = []

    def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = x.float() @ w.float()  # float32, whatever autocast the program runs under
        seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
        return out

    @replay.verify(reference=reference, sample=1.0, outliers=False, rtol=1e-5, atol=1e-5, on_mismatch=found.append)
    def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return x @ w

    gen = torch.Generator().manual_seed(9)
    x, w = torch.randn(4, 256, generator=gen), torch.randn(256, 8, generator=gen, requires_grad=True)
    before = replay.verify.counters()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 would miss 1e-5 by far
        matmul(x, w)
    replay.verify.drain()
    assert seen == [(False, False)] and not found and delta(before)["checked"] == 1
    replay.verify.stop(matmul.__replay_spec__.op)


def test_under_torch_compile_the_reference_launched_by_the_caller_runs_eagerly(
        launched_by: Callable[[str, str], None], verifying: Path) -> None:
    launched_by("cpu", "caller")
    compiling: list[bool] = []

    def reference(x: torch.Tensor) -> torch.Tensor:
        compiling.append(torch.compiler.is_compiling())
        return x * 3

    @replay.verify(reference=reference, sample=1.0, outliers=False)
    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: triple(x) + 1, backend="eager")
    before = replay.verify.counters()
    for _ in range(3):
        assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 4.0))
    replay.verify.drain()
    assert compiling == [False] * 3 and delta(before)["checked"] == 3
    replay.verify.stop(triple.__replay_spec__.op)


def test_outside_compiled_code_a_check_launches_its_reference_without_torch_compiles_wrapper(
        launched_by: Callable[[str, str], None], verifying: Path) -> None:
    # the wrapper that keeps torch.compile from tracing the reference (above) costs a check ~10 us
    # of frames of torch._dynamo's: taken only where a frame callback of torch.compile's is set
    launched_by("cpu", "caller")
    replay.verify("verify_rowscale", sample=1.0, outliers=False)
    x = torch.randn(4, 16)
    rowscale_batched(x, 2.0)  # the first check makes the launch (and imports torch._dynamo)
    replay.verify.drain()
    dynamo = str(Path(torch.__file__).parent / "_dynamo")
    entered: list[str] = []

    def profile(frame, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(dynamo):
            entered.append(frame.f_code.co_name)
    before = replay.verify.counters()
    sys.setprofile(profile)
    try:
        rowscale_batched(x, 2.0)
    finally:
        sys.setprofile(None)
    replay.verify.drain()
    assert delta(before)["checked"] == 1 and entered == []


def test_a_reference_that_raises_on_the_calling_thread_holds_none_of_the_programs_memory(
        launched_by: Callable[[str, str], None], verifying: Path) -> None:
    """Its exception waits for the worker without its traceback, whose frames would keep the
    program's tensors alive until then (and, in a cycle, until a collection)."""
    launched_by("cpu", "caller")

    def reference(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("broken")

    @replay.verify(reference=reference, sample=1.0, outliers=False)
    def negate(x: torch.Tensor) -> torch.Tensor:
        return -x

    def step() -> weakref.ref:
        activations = torch.ones(1 << 16)  # the program's, in the frame that made the call
        negate(activations[:4])
        return weakref.ref(activations)
    gc.disable()
    try:
        alive = step()
        replay.verify.drain()
        assert alive() is None
    finally:
        gc.enable()
        replay.verify.stop(negate.__replay_spec__.op)


@pytest.mark.parametrize("launcher", ["worker", "caller"])
def test_checks_holding_max_pending_bytes_leave_the_next_call_unchecked(
        launcher: str, launched_by: Callable[[str, str], None], verifying: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What pending checks hold (their copies; a caller-launched reference's outputs) is bounded:
    past max_pending_bytes a call is dropped, not copied, and checks resume once they are done."""
    launched_by("cpu", launcher)
    worker_may_go = threading.Event()
    check = verifier.Verifier._check
    monkeypatch.setattr(verifier.Verifier, "_check", lambda self, c: (worker_may_go.wait(30), check(self, c))[1])

    @replay.verify(reference=lambda x: x + 1, sample=1.0, outliers=False)
    def increment(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    x = torch.ones(1024)  # 4 KiB: an input copy and an output copy a check, 8 KiB
    before = replay.verify.counters()
    try:
        replay.verify.configure(max_pending_bytes=12 << 10)
        increment(x)  # pending: 8 KiB (with the caller's reference's output, 12)
        increment(x)  # under 12 KiB on the worker's path, at it on the caller's: dropped there
        increment(x)  # at or past it either way: dropped
        dropped = delta(before)["dropped"]
        worker_may_go.set()
        replay.verify.drain()
        increment(x)  # nothing pending: checked
        replay.verify.drain()
    finally:
        worker_may_go.set()
        replay.verify.configure(max_pending_bytes=verifier.Settings().max_pending_bytes)
        replay.verify.stop(increment.__replay_spec__.op)
    counted = delta(before)
    assert dropped == (1 if launcher == "worker" else 2)
    assert counted["dropped"] == dropped and counted["checked"] == 4 - dropped


def test_max_pending_bytes_must_be_a_positive_number_of_bytes() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_pending_bytes"):
            replay.verify.configure(max_pending_bytes=bad)  # type: ignore[arg-type]


def test_a_drain_gives_up_at_its_timeout_and_says_what_it_left(verifying: Path) -> None:
    @replay.verify(reference=lambda x: (time.sleep(0.05), x * 2)[1], sample=1.0, outliers=False)
    def slow_checked(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    for _ in range(30):
        slow_checked(torch.ones(2))
    started = time.monotonic()
    left = replay.verify.drain(0.1)
    assert time.monotonic() - started < 1.0 and left > 0
    assert replay.verify.drain(30) == 0
    replay.verify.stop("test_a_drain_gives_up_at_its_timeout_and_counts_what_it_left.<locals>.slow_checked")


def test_configuration_at_run_time(verifying: Path) -> None:
    replay.verify("verify_rowscale", sample=1.0)
    replay.verify.configure(enabled=False)
    before = replay.verify.counters()
    rowscale_batched(torch.ones(2, 4), 1.0)
    assert delta(before)["checked"] == 0
    replay.verify.configure(enabled=True, sample=1.0)
    rowscale_batched(torch.ones(2, 4), 1.0)
    replay.verify.drain()
    assert delta(before)["checked"] == 1
    with pytest.raises(ValueError, match="compile='never'"):
        replay.verify.configure(compile="never")
    with pytest.raises(ValueError, match="sample=2"):
        replay.verify("verify_rowscale", sample=2)
    with pytest.raises(ValueError, match="give it a reference"):
        replay.verify(sample=0.5)(lambda x: x)


ENV_PROGRAM = textwrap.dedent("""
    import torch, replay

    op = replay.op("env_double", batch_axes={"x": 0, "out": 0})

    @op.reference
    def reference(x):
        return x * 2

    @op.batched
    def batched(x):
        return x * 2 + (x > 10).float()  # wrong where a value passes 10

    for i in range(20):
        batched(torch.full((2, 3), float(i)))
""")


def test_replay_verify_turns_it_on_without_code_changes(tmp_path: Path) -> None:
    env = dict(os.environ, REPLAY_VERIFY="env_double@1.0,other@2", REPLAY_VERIFY_REPORT="1",
               REPLAY_VERIFY_DIR=str(tmp_path / "mismatches"), PYTHONPATH=str(Path(__file__).parents[1]))
    result = subprocess.run([sys.executable, "-c", ENV_PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "replay.verify: REPLAY_VERIFY entry 'other@2': the rate must be a share of calls, 0 to 1; skipped"
    mismatches = [line for line in lines if "differ" in line]
    assert len(mismatches) == 9 and mismatches[0].startswith("replay.verify: env_double (batched) call 11: rows 0-1")
    assert sum("; snapshot " in line for line in mismatches) == 3  # the limit per op
    assert lines[-1] == "replay.verify: calls 20, checked 20, flagged 0, skipped 0, dropped 0, failed 9, " \
                        "snapshots 3, abandoned 0, unscored 0"


@pytest.mark.gpu
def test_calls_during_cuda_graph_capture_are_skipped_and_counted(verifying: Path) -> None:
    replay.verify("verify_rowscale", sample=1.0)
    x = torch.ones(4, 8, device="cuda")
    rowscale_batched(x, 2.0)  # warm up outside the capture
    replay.verify.drain()
    before = replay.verify.counters()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rowscale_batched(x, 2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full((4, 8), 2.0, device="cuda"))
    assert delta(before)["skipped"] == 1 and delta(before)["checked"] == 0


def test_positional_only_and_star_arguments_still_report_their_mismatch(verifying: Path) -> None:
    found: list[Mismatch] = []

    @replay.verify(reference=lambda x, /, *more: x * 2, sample=1.0, outliers=False, on_mismatch=found.append)
    def off_by_one(x: torch.Tensor, /, *more: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    off_by_one(torch.ones(3))
    off_by_one(torch.ones(3), torch.zeros(1))
    replay.verify.drain()
    assert [m.call for m in found] == [0, 1]
    assert found[0].snapshot is not None and found[0].snapshot.is_dir()  # a positional-only call records
    assert found[1].snapshot is None and "could not be written" in found[1].line()  # a tuple of tensors does not
    replay.verify.stop(off_by_one.__replay_spec__.op)


def test_replay_verify_naming_an_op_without_a_reference_leaves_it_alone(monkeypatch: pytest.MonkeyPatch,
                                                                       said) -> None:
    @replay.capture("verify_no_reference")
    def lonely(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    from replay.verify import from_env
    monkeypatch.setenv("REPLAY_VERIFY", "verify_no_reference@1.0")
    from_env()
    assert torch.equal(lonely(torch.zeros(2)), torch.ones(2)) and torch.equal(lonely(torch.ones(2)), torch.ones(2) * 2)
    assert said() == [
        "replay.verify: REPLAY_VERIFY: replay.verify: op 'verify_no_reference' has no reference variant to check "
        "against; not verified"]


def batch_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([[t.data_ptr(), t.numel(), call_stats.TYPE_CODES[t.dtype]] for t in tensors])


@pytest.mark.interpreter
@pytest.mark.parametrize("sizes", [(1,), (5000, 3), (4096 * 32 + 7, 1, 640, 33, 2)])
def test_the_statistics_kernel_reads_every_tensor_of_a_batch_table(sizes: tuple[int, ...]) -> None:
    """The kernel (in Triton's interpreter here, reading host memory by address) and the host's
    host twin describe a batch's tensors alike, and both agree with float64 sums."""
    gen = torch.Generator().manual_seed(4)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    tensors = [(torch.randn(n, generator=gen) * (w + 1)).to(dtypes[w % 4]) for w, n in enumerate(sizes)]
    tensors[0].view(-1)[-1] = -7.5 * len(sizes)  # the largest magnitude sits in the last element
    table, by_kernel = call_stats.buffers(1, len(sizes) + 1, cuda=False)
    _, by_torch = call_stats.buffers(1, len(sizes) + 1, cuda=False)
    table[0, :len(sizes)] = batch_table(tensors)
    by_kernel[0, -1].fill_(123.0)
    call_stats.launch_in_triton(table[0], by_kernel[0], len(sizes))
    call_stats.on_host(tensors, by_torch[0])
    assert torch.equal(by_kernel[0, -1], torch.full_like(by_kernel[0, -1], 123.0))  # a row past the batch: untouched
    for partials in (by_kernel[0], by_torch[0]):
        sums, tops = partials[:, :2].double().sum(dim=2), partials[:, 2].amax(dim=1)
        for row, tensor in enumerate(tensors):
            exact = tensor.double()
            assert torch.allclose(sums[row], torch.stack((exact.abs().sum(), exact.square().sum())), rtol=1e-5)
            assert tops[row] == exact.abs().max()


def test_the_gate_scores_each_call_on_what_its_tensors_held(verifying: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the gate scores for each call is what the call's tensors held, batch after batch, over
    more batches than are ever in flight."""
    seen: list[tuple[tuple, list[float]]] = []
    flag = KindGates.flag
    monkeypatch.setattr(KindGates, "flag", lambda self, ids, x: (seen.extend(zip(ids.tolist(), x.tolist())),
                                                                 flag(self, ids, x))[1])
    replay.verify("verify_rowscale", sample=0.0, outliers=1.0)
    inputs = [torch.full((2, 4), float(i)) for i in range(3 * BATCH * BATCHES + 5)]
    for x in inputs:
        rowscale_batched(x, 2.0)
        if len(seen) + BATCH * (BATCHES - 1) < len(inputs):  # never let the gate fall all batches behind
            replay.verify.drain()
    replay.verify.drain()
    assert len(seen) == len(inputs)
    for (kind, numbers), x in zip(seen, inputs):  # one kind; one tensor read, the rest of the row zeros
        assert kind == seen[0][0] and numbers == [x[0, 0].item()] * 3 + [0.0] * (WIDTH - 3)


@pytest.mark.parametrize(("device", "launcher"), LAUNCHERS)
def test_no_wait_for_the_device_on_the_calling_thread(device: str, launcher: str,
                                                      launched_by: Callable[[str, str], None], verifying: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call checked, the gate on, spikes flagged: nothing that waits for a device's work is
    reached on the thread that calls the op (counted by patching each of them), whether the
    reference is launched there or on the worker."""
    launched_by(device, launcher)
    caller = threading.get_ident()
    waits: list[str] = []

    def counted(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            if threading.get_ident() == caller:
                waits.append(name)
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapper)
    for owner, name in ((torch.Tensor, "item"), (torch.Tensor, "cpu"), (torch.Tensor, "tolist"),
                        (torch.Tensor, "__bool__"), (torch.cuda, "synchronize"),
                        (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")):
        counted(owner, name)
    replay.verify("verify_rowscale", sample=1.0)
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(8, 64, generator=gen) for _ in range(150)]
    xs[120][0, 0] = 99.0
    xs = [x.to(device) for x in xs]
    rowscale_batched(xs[0], 0.5)  # the first call compiles the statistics kernel (Triton reads its cache)
    replay.verify.drain()
    waits.clear()
    before = replay.verify.counters()
    for x in xs:
        rowscale_batched(x, 0.5)
    calls_checked = waits[:]
    monkeypatch.undo()
    replay.verify.drain()
    counted = delta(before)
    # every call took the checked path (a check the queue had no room for is dropped, not waited for)
    assert calls_checked == [] and counted["checked"] >= 1 and counted["checked"] + counted["dropped"] == len(xs)


def test_a_clean_decode_loop_is_almost_never_flagged(verifying: Path) -> None:
    """Prefill and decode steps, repeated: sizes, positions and lengths change every call by
    design, the cache fills; after warm-up at most 1% of calls are flagged."""
    replay.verify("verify_attend", sample=0.0, outliers=1.0)
    gen = torch.Generator().manual_seed(6)
    calls, flagged_after_warmup = 0, 0
    for repeat in range(30):
        before = replay.verify.counters()
        cache = torch.zeros(64, 32)
        cache[:8] = torch.randn(8, 32, generator=gen)
        attend_batched(torch.randn(8, 32, generator=gen), cache, torch.arange(8), 8)
        for position in range(8, 40):
            cache[position] = torch.randn(32, generator=gen)
            attend_batched(torch.randn(1, 32, generator=gen), cache, torch.tensor([position]), position + 1)
        replay.verify.drain()
        if repeat >= 2:
            calls += 33
            flagged_after_warmup += delta(before)["flagged"]
    assert flagged_after_warmup <= 0.01 * calls
    before = replay.verify.counters()
    spiked = torch.randn(1, 32, generator=gen)
    spiked[0, 3] = 40.0
    attend_batched(spiked, cache, torch.tensor([39]), 40)  # the same gate sees an unusual call
    replay.verify.drain()
    replay.verify.stop("verify_attend")
    assert delta(before)["flagged"] == 1


@pytest.mark.gpu
def test_the_statistics_kernel_launched_directly_reads_device_memory_through_pinned_tables() -> None:
    """After the first launch (through Triton) batches go through the compiled launcher directly;
    the tables and partials are pinned host memory the device reads and writes; unaligned views
    and every element type come out as torch says."""
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(3 * 4096 + 1, generator=gen)
    batches = [[base[:4096].cuda()], [base.cuda()[1:4097], base[:77].to(torch.bfloat16).cuda()],
               [base.cuda().half(), base.cuda().double()[5:]]]
    table, partials = call_stats.buffers(len(batches), 4, cuda=True)
    for b, tensors in enumerate(batches):
        table[b, :len(tensors)] = batch_table(tensors)
        call_stats.launch(table[b], partials[b], len(tensors))
    torch.cuda.synchronize()
    if direct_launch.FITS:
        assert call_stats._LAUNCHER.compiled[torch.cuda.current_device(), ()] is not None  # launched directly
    for b, tensors in enumerate(batches):
        _, twin = call_stats.buffers(1, 4, cuda=False)
        call_stats.on_host([t.cpu() for t in tensors], twin[0])
        for row in range(len(tensors)):
            assert torch.allclose(partials[b, row, :2].double().sum(1), twin[0, row, :2].double().sum(1), rtol=1e-5)
            assert partials[b, row, 2].max() == twin[0, row, 2].max()


def test_calls_the_gate_reads_nothing_of_are_still_verified(verifying: Path) -> None:
    """An op handed only tensors the gate does not read (integers, non-contiguous), in batches of
    their own and beside batches that read some: the calls run, are counted and sampled."""
    @replay.verify(reference=lambda x: x * 2, sample=0.05)
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    before = replay.verify.counters()
    for call in range(3 * BATCH):
        x = torch.arange(8) if call < BATCH else torch.ones(8, 8).t() if call < 2 * BATCH else torch.ones(8)
        assert torch.equal(twice(x), x * 2)
    replay.verify.drain()
    counted = delta(before)
    assert counted["calls"] == 3 * BATCH and counted["failed"] == 0 and counted["checked"] >= 1
    replay.verify.stop(twice.__replay_spec__.op)


def spiked_after(gates: KindGates, row: int, scale: float, calls: int, gen: torch.Generator) -> bool:
    """Teach `row` `calls` calls of noise at `scale`, then say whether a spike is flagged."""
    x = (torch.randn(calls, WIDTH, generator=gen).abs() * scale).double().numpy()
    gates.flag(np.full(calls, row), x)
    spike = x[:1].copy()
    spike[0, 2] = scale * 50
    return bool(gates.flag(np.array([row]), spike)[0])


def test_a_gate_reading_a_share_of_calls_counts_its_warm_up_in_calls_read() -> None:
    """Reading 1 call in 8, a kind first read halfway through the gate's warm-up (long after the
    op's WARMUP-th call) is learnt, not flagged; one first read after WARMUP reads is flagged at
    once."""
    flagged: list[int] = []
    feed = gate_module.StatsFeed(flagged.append, lambda name, n: None)
    for read in range(gate_module.WARMUP + 8):
        x = torch.ones(64 if read == gate_module.WARMUP // 2 else 512 if read == gate_module.WARMUP + 4 else 8)
        if feed.observe(8 * read, (x,), {}):
            feed.close()
    assert flagged == [8 * (gate_module.WARMUP + 4)]


def test_a_kind_learnt_anew_after_the_table_fills_keeps_nothing_of_the_one_before() -> None:
    gen = torch.Generator().manual_seed(8)
    gates = KindGates()
    first, _ = gates.kind_id(("loud",))
    spiked_after(gates, first, 100.0, 200, gen)  # the loud kind learns a large spread
    for k in range(KINDS - 1):  # the table fills
        gates.kind_id(("other", k))
    row, new = gates.kind_id(("quiet",))  # every kind starts again: the quiet one in the loud one's row
    assert new and row == first and spiked_after(gates, row, 0.01, 200, gen)


def test_a_nan_early_teaches_a_kind_nothing() -> None:
    gen = torch.Generator().manual_seed(9)
    gates = KindGates()
    row, _ = gates.kind_id(("masked",))
    nan_rows = np.full((3, WIDTH), gate_module.NOT_FINITE)
    gates.flag(np.full(3, row), nan_rows)  # the first calls: not finite, not learnt
    assert spiked_after(gates, row, 1.0, 200, gen)


def test_a_function_of_the_script_being_run_is_told_its_snapshots_need_a_module(verifying: Path, said) -> None:
    def scripted(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    scripted.__module__ = "__main__"  # as a function in `python prog.py` is
    replay.verify(reference=lambda x: x + 1, sample=0.0)(scripted)
    assert said() == ["replay.verify: test_a_function_of_the_script_being_run_is_told_its_snapshots_need_a_module."
                      "<locals>.scripted is defined in the script being run (__main__): its mismatch snapshots "
                      "replay once it lives in a module that `replay run --provider MODULE` can import"]
    replay.verify.stop("test_a_function_of_the_script_being_run_is_told_its_snapshots_need_a_module.<locals>.scripted")


def test_a_failing_gate_never_breaks_the_program(verifying: Path, monkeypatch: pytest.MonkeyPatch, said) -> None:
    """The scoring fails (here on purpose): the calls go on, it is said once, the gate's buffers
    are not lost (once it works again, it scores batch after batch)."""
    replay.verify("verify_rowscale", sample=0.0, outliers=1.0)
    works = gate_module.features
    monkeypatch.setattr(gate_module, "features", lambda *a: 1 / 0)
    x = torch.ones(2, 4)
    for _ in range(BATCHES * BATCH + 5):
        assert torch.equal(rowscale_batched(x, 2.0), x * 2)
    replay.verify.drain()
    assert said() == ["replay.verify: the outlier gate failed: ZeroDivisionError: division by zero; the program goes on"]
    monkeypatch.setattr(gate_module, "features", works)
    before = replay.verify.counters()
    for _ in range(2 * BATCH):
        rowscale_batched(x, 2.0)
    replay.verify.drain()
    assert delta(before)["unscored"] == 0


def test_importing_replay_leaves_dynamo_unloaded() -> None:
    # every `replay` command, and every program `replay record` runs, imports replay: the verifier's
    # graph break must not import torch._dynamo then (~1 s of each start), only at its first check
    probe = subprocess.run([sys.executable, "-c", "import sys, replay.cli; print('torch._dynamo' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"
