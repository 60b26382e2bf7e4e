"""The outlier gate's time budget: each gate measures what reading a call costs against the
program's time a call, and gates of outliers=True read the share of calls the budget allows
(replay/verify/gate.py, Verifier._rebudget). Time is a fake clock here: what the gate measures
is what the test makes it take."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch

import replay
from replay.verify import gate as gate_module
from replay.verify.gate import BATCH, MIN_SHARE, StatsFeed, budgeted_share
from replay.verify.verifier import VERIFIER

NOTING = 0.001  # what noting a call costs, on the fake clock
BETWEEN = 0.003  # the program's own time between two calls


OP = "verify_budget_doubled"
twice = replay.op(OP)


@twice.reference
def doubled_reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.batched
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The gate's perf_counter, moved by the test; noting a call takes NOTING on it."""
    now = [100.0]
    monkeypatch.setattr(gate_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    observe = StatsFeed._observe

    def slow(self: StatsFeed, *args: object) -> bool:
        now[0] += NOTING
        return observe(self, *args)
    monkeypatch.setattr(StatsFeed, "_observe", slow)
    return now


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The numbers of the calls the gate notes."""
    noted: list[int] = []
    observe = StatsFeed.observe
    monkeypatch.setattr(StatsFeed, "observe", lambda self, number, *rest: (noted.append(number),
                                                                           observe(self, number, *rest))[1])
    return noted


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[None]:
    replay.verify.configure(directory=tmp_path, seed=0, enabled=True)
    yield
    replay.verify.configure(gate_budget=gate_module.BUDGET)
    replay.verify.stop(OP)
    replay.verify.drain()


def test_the_share_is_the_budget_over_the_gates_rates() -> None:
    assert budgeted_share([0.005, 0.01], 0.02) == 1.0  # together under the budget: every call
    assert budgeted_share([0.1, 0.15], 0.02) == pytest.approx(0.08)
    assert budgeted_share([50.0], 0.02) == MIN_SHARE  # never none
    assert budgeted_share([], 0.02) == 1.0


def feed_calls(feed: StatsFeed, numbers: range, clock: list[float], between: float) -> None:
    """The calls `numbers` read, the program's own time `between` before each."""
    x = torch.ones(4, 8)
    for number in numbers:
        clock[0] += between
        if feed.observe(number, (x,), {}):
            feed.close()


def test_a_gate_measures_its_time_a_call_read_over_the_programs_time_a_call(clock: list[float]) -> None:
    feed = StatsFeed(lambda number: None, lambda name, n: None)
    feed_calls(feed, range(BATCH), clock, 5 * BETWEEN)  # the first batch pays the set-up: not measured
    assert feed.rate == 0.0
    feed_calls(feed, range(BATCH, 2 * BATCH), clock, BETWEEN)
    assert feed.rate == pytest.approx(NOTING / BETWEEN)
    # reading 1 call in 4: a gap between reads spans four calls of the program
    feed_calls(feed, range(2 * BATCH, 6 * BATCH, 4), clock, 4 * BETWEEN)
    assert feed.rate == pytest.approx(NOTING / BETWEEN)  # the same cost: its time a call of the program's own


def test_the_programs_idle_spells_are_not_its_time_a_call(clock: list[float]) -> None:
    feed = StatsFeed(lambda number: None, lambda name, n: None)
    feed_calls(feed, range(BATCH), clock, BETWEEN)  # the set-up
    x = torch.ones(4, 8)
    for number in range(BATCH, 2 * BATCH):
        clock[0] += BETWEEN + (30.0 if number % 10 == 5 else 0.0)  # a pause every tenth call
        if feed.observe(number, (x,), {}):
            feed.close()
    assert feed.rate == pytest.approx(NOTING / BETWEEN)


def run(calls: int, clock: list[float]) -> None:
    x = torch.ones(4, 8)
    for _ in range(calls):
        clock[0] += BETWEEN
        doubled(x)


def test_a_gate_over_its_budget_reads_the_share_the_budget_allows(clock: list[float], reads: list[int],
                                                                  budgeted: None) -> None:
    replay.verify(OP, sample=0.0)
    run(2 * BATCH, clock)  # every call read until a batch after the first says what reading costs
    assert reads == list(range(2 * BATCH))
    share = 0.02 / (NOTING / BETWEEN)
    policy = next(p for p in VERIFIER._policies if p.op.name == OP)
    assert policy.gate_share == pytest.approx(share)
    reads.clear()
    run(4000, clock)
    assert 0.6 * share * 4000 < len(reads) < 1.4 * share * 4000  # chosen at random, about that share


def test_a_share_given_is_read_whatever_it_costs_and_a_larger_budget_reads_every_call(
        clock: list[float], reads: list[int], budgeted: None) -> None:
    replay.verify(OP, sample=0.0, outliers=1.0)
    run(3 * BATCH, clock)
    assert len(reads) == 3 * BATCH
    replay.verify.configure(gate_budget=0.5)  # over the gate's rate, 1/3
    replay.verify(OP, sample=0.0)
    reads.clear()
    run(3 * BATCH, clock)
    assert len(reads) == 3 * BATCH


@pytest.mark.parametrize("budget", [0, -0.1, 1.5, True, "half"])
def test_the_budget_must_be_a_share_of_the_programs_time(budget: object) -> None:
    with pytest.raises(ValueError, match="gate_budget="):
        replay.verify.configure(gate_budget=budget)  # type: ignore[arg-type]


def share_after_draining(times: int, clock: list[float]) -> float:
    """The share the op's budgeted gate reads after `times` rounds of a quarter batch of calls and
    a drain."""
    replay.verify(OP, sample=0.0)
    for _ in range(times):
        run(BATCH // 4, clock)
        replay.verify.drain()
    return next(p for p in VERIFIER._policies if p.op.name == OP).gate_share


def test_a_program_that_drains_often_is_measured_too(clock: list[float], budgeted: None) -> None:
    """Every few calls a drain closes the gate's batch before it is full (and waits for the
    device): what the reads cost is measured there, the wait left out."""
    assert share_after_draining(8, clock) == pytest.approx(0.02 / (NOTING / BETWEEN))


def test_a_drains_wait_for_the_device_is_not_the_gates_cost(clock: list[float], budgeted: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    score = StatsFeed._score

    def waiting(self: StatsFeed, wait: bool) -> float:
        waited = 5.0 if wait else 0.0  # as if the device took 5 s to finish the batch
        clock[0] += waited
        return score(self, wait) + waited
    monkeypatch.setattr(StatsFeed, "_score", waiting)
    assert share_after_draining(4, clock) == pytest.approx(0.02 / (NOTING / BETWEEN))


def test_batches_a_drain_cuts_short_cost_their_reads_what_a_full_batch_would(
        clock: list[float], budgeted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a batch costs the same however few calls it holds (a launch, the scoring). A
    program that drains every 100 calls has its batches closed there; counted whole against the
    few reads of a small batch, that cost would lower the share, so the next batches would be
    smaller still, down to the least share. Each read is charged its part of a full batch's
    closing instead, and the share settles where the budget puts it."""
    close = StatsFeed._close

    def costly(self: StatsFeed) -> None:
        clock[0] += BATCH * NOTING if self._calls else 0.0  # a close costs what noting a full batch does
        close(self)
    monkeypatch.setattr(StatsFeed, "_close", costly)
    replay.verify(OP, sample=0.0)
    for _ in range(40):
        run(100, clock)
        replay.verify.drain()
    policy = next(p for p in VERIFIER._policies if p.op.name == OP)
    assert policy.gate_share == pytest.approx(0.02 / (2 * NOTING / BETWEEN), rel=0.1)
