"""replay.verify: a kernel wrong only for a rare input pattern is caught through the outlier gate
at a 1% sampling rate, and its snapshot replays with exit 1 naming the rows; no false alarm over
10,000 calls of a right kernel; torch.compile, threads, a drain that never hangs, run-time
configuration, REPLAY_VERIFY, and CUDA graph capture (GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from click.testing import CliRunner

import replay
from replay.cli import main
from replay.verify import Mismatch

rowscale = replay.op("verify_rowscale", batch_axes={"x": 0, "out": 0})


@rowscale.reference
def rowscale_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.double() * scale).float()


@rowscale.batched
def rowscale_batched(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Right, except for rows holding a value over 50: there it adds 1 (a rare input pattern)."""
    spiked = x.abs().amax(dim=1, keepdim=True) > 50  # no data-dependent indexing: a CUDA graph can hold it
    return x * scale + spiked.to(x.dtype)


@pytest.fixture
def verifying(tmp_path: Path) -> Iterator[Path]:
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True, compile="break")
    yield tmp_path / "mismatches"
    replay.verify.stop("verify_rowscale")
    replay.verify.drain()


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in replay.verify.counters().items()}


def test_a_rare_wrong_pattern_is_caught_through_the_gate_and_replays_with_exit_1(verifying: Path) -> None:
    found: list[Mismatch] = []
    replay.verify("verify_rowscale", sample=0.01, on_mismatch=found.append)
    gen = torch.Generator().manual_seed(1)
    before = replay.verify.counters()
    for call in range(1500):
        x = torch.randn(8, 64, generator=gen)
        if call in (500, 1200):
            x[3, 17] = 100.0  # a spike in row 3
        rowscale_batched(x, 0.5)
    replay.verify.drain()
    assert [(m.call, m.rows, m.output) for m in found] == [(500, [3], "out"), (1200, [3], "out")]
    counted = delta(before)
    assert counted["calls"] == 1500 and counted["failed"] == 2 and counted["flagged"] >= 2
    assert counted["checked"] < 100  # about 1% sampled, plus what the gate flagged
    snapshot = found[0].snapshot
    assert snapshot is not None and snapshot.parent == verifying
    result = CliRunner().invoke(main, ["run", str(snapshot), "--provider", __name__])
    assert result.exit_code == 1, result.output
    assert "row 3" in result.output or "rows 3" in result.output


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


def test_threads_call_a_verified_op_at_once(verifying: Path) -> None:
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


def test_a_drain_gives_up_at_its_timeout_and_counts_what_it_left(verifying: Path) -> None:
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
                        "snapshots 3, abandoned 0"


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
