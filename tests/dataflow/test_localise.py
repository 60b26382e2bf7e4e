"""Propagated replay and precision bisection on the tiny model with a planted error in one layer's
RMSNorm (its weights saturate at 2.0, and only layer 1's ffn norm holds a 3.0): small in that call,
then carried by every call after it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

import replay
from replay.cli import main as cli_main
from replay.engine import ReplayOptions
from replay.engine.ddmin import ddmin
from replay.engine.precision import bisect_precision
from replay.engine.propagate import propagate
from kernel_copies import RMSNORM_WEIGHT_SATURATES, edited_kernels
from replay_kernels import bugs

from tests.dataflow.conftest import DEVICE, PLANTED_CALL

def test_propagation_names_the_planted_call_and_the_calls_that_only_inherit(prefill: Path) -> None:
    with bugs.planting("rmsnorm_weight_saturates"):
        report = propagate(prefill, ReplayOptions(device=DEVICE))
    assert report.culprit is not None and report.culprit.index == PLANTED_CALL
    assert report.culprit.scope == {"step": 0, "layer": 1} and report.culprit.op == "rmsnorm"
    verdicts = {c.index: c.verdict for c in report.calls}
    assert all(v == "ok" for i, v in verdicts.items() if i < PLANTED_CALL)
    later = [i for i in verdicts if i > PLANTED_CALL]
    assert later and all(verdicts[i] == "inherits" for i in later)  # the final rmsnorm too: same bug, weight < 2
    assert all(c.fed for c in report.calls[1:])  # every call after the first read a replayed producer


def test_a_clean_chain_stays_within_tolerance(prefill: Path) -> None:
    report = propagate(prefill, ReplayOptions(device=DEVICE))
    assert report.passed and report.culprit is None
    assert report.replays == 3 * len(report.calls)


def _planted_code(tmp_path: Path) -> Path:
    """A copy of the kernels whose rmsnorm kernel clamps its weights at 2.0, for --code."""
    return edited_kernels(tmp_path, RMSNORM_WEIGHT_SATURATES)


def test_replay_run_propagate_names_the_call_from_the_command_line(prefill: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli_main, ["run", str(prefill), "--propagate", "--code", str(_planted_code(tmp_path)),
                                           "--json", str(tmp_path / "out.json")])
    assert result.exit_code == 1, result.output
    assert f"first call over its own tolerance: call {PLANTED_CALL} (rmsnorm, step 0 layer 1)" in \
        " ".join(result.output.split())
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["culprit"] == PLANTED_CALL
    assert {c["verdict"] for c in data["calls"] if c["index"] > PLANTED_CALL} == {"inherits"}


def test_replay_run_propagate_refuses_what_does_not_apply_and_old_recordings(prefill: Path) -> None:
    refused = CliRunner().invoke(cli_main, ["run", str(prefill), "--propagate", "--op", "rmsnorm"])
    assert refused.exit_code == 2 and "--op cannot be combined with --propagate" in refused.output
    shipped = Path(__file__).parents[2] / "snapshots" / "prefill_001"
    old = CliRunner().invoke(cli_main, ["run", str(shipped), "--propagate"])
    assert old.exit_code == 2 and "memory footprint" in old.output


def test_precision_bisection_finds_the_planted_call_in_a_few_log2_runs(prefill: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal.json"
    with bugs.planting("rmsnorm_weight_saturates"):
        found = bisect_precision(prefill, ReplayOptions(device=DEVICE), journal=journal)
        assert found.minimal == [PLANTED_CALL]
        assert found.tests <= 3 * math.ceil(math.log2(len(found.candidates)))
        again = bisect_precision(prefill, ReplayOptions(device=DEVICE), journal=journal)  # resumed: answered by the journal
    assert again.minimal == [PLANTED_CALL] and again.tests == 0 and again.remembered == found.tests
    clean = bisect_precision(prefill, ReplayOptions(device=DEVICE), journal=journal)  # other code: a new search
    assert clean.minimal is None and clean.tests == 0


def test_bisect_precision_from_the_command_line(prefill: Path, tmp_path: Path) -> None:
    page = tmp_path / "precision.html"
    result = CliRunner().invoke(cli_main, ["bisect-precision", str(prefill), "--fresh", "--html", str(page),
                                           "--code", str(_planted_code(tmp_path)), "--json", "-"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["minimal"] == [PLANTED_CALL]
    text = page.read_text()
    assert text.count('class="set"') == data["tests"] and 'data-fixed="true"' in text
    assert 'class="evidence" data-call="33" data-name="out/out"' in text  # the logits, off with no call switched


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1,
                                                                                 max_size=3))))
def test_ddmin_returns_a_set_that_holds_and_drops_nothing_it_needs(case: tuple[int, set[int]]) -> None:
    n, needed = case
    asked: list[tuple[int, ...]] = []

    def holds(subset: tuple[int, ...]) -> bool:
        asked.append(subset)
        return needed <= set(subset)

    found = ddmin(list(range(n)), holds)
    assert set(found) == needed  # one-minimal, and here the only minimal set
    assert len(asked) == len(set(asked))  # no set asked twice
    if len(needed) == 1:
        assert len(asked) <= 2 * math.ceil(math.log2(n)) + 2


@pytest.mark.parametrize("by, groups", [("layer", ["layer 1"]), ("op", ["rmsnorm"])])
def test_precision_bisection_over_layers_or_ops(prefill: Path, by: str, groups: list[str]) -> None:
    with bugs.planting("rmsnorm_weight_saturates"):
        found = bisect_precision(prefill, ReplayOptions(device=DEVICE), by=by, use_journal=False)
    assert found.groups == groups and PLANTED_CALL in (found.minimal or [])
    assert found.tests <= 6  # two layers and a tail, or nine ops


def test_a_call_reading_a_strided_slice_is_fed_its_producers_bytes_in_their_places(tmp_path: Path) -> None:
    from tests.dataflow import strided_ops as ops

    x = torch.arange(64.0).reshape(8, 8)
    with replay.recording(tmp_path / "snap"):
        y = ops.double_batched(x)
        ops.left_sum_batched(y[:, :4])  # a view of every row's first half: strides (8, 1), not dense
    options = ReplayOptions(providers=frozenset({ops.__name__}))
    report = propagate(tmp_path / "snap", options)
    assert report.passed and report.calls[1].fed == ["in/x"]
    with ops.double.replacing("batched", lambda x: x * 3):  # the producer now writes 3x: the slice must carry it
        wrong = propagate(tmp_path / "snap", options)
    assert [c.verdict for c in wrong.calls] == ["own error", "inherits"]
    assert wrong.calls[1].drift is not None and wrong.calls[1].drift.max_abs == pytest.approx(
        float((x[:, :4] * 3 - x[:, :4] * 2).sum(-1).abs().max()))
