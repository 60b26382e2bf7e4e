"""The metrics beside the tolerance: values against hand-computed ones in every float dtype, the
pass rules, the device's verdict equal to the host's, and --metric on run, diff and verify."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

import replay
from replay import metrics
from replay.cli import main as cli_main
from replay.compare import compare
from replay.registry import all_ops

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", FLOATS)
def test_each_metric_against_a_hand_computed_value(dtype: torch.dtype) -> None:
    # exactly representable in every dtype here: the arithmetic below is exact
    a = torch.tensor([1.0, 2.0, 0.0, 4.0], dtype=dtype)
    e = torch.tensor([1.0, 2.5, 0.0, 4.0], dtype=dtype)
    m = metrics.measure(a, e)
    sq_e, sq_a, cross, err = 1 + 6.25 + 16, 1 + 4 + 16, 1 + 5 + 16, 0.25
    assert m["max_abs"] == 0.5 and m["max_rel"] == 0.2
    assert m["nmse"] == pytest.approx(err / sq_e, rel=1e-12)
    assert m["rel_diff"] == pytest.approx(1 - 2 * cross / (sq_a + sq_e), rel=1e-12)
    assert m["cosine"] == pytest.approx(cross / math.sqrt(sq_a * sq_e), rel=1e-12)
    assert m["beyond"] == 0.25  # one element of four is more than a thousandth off
    assert m["finite_agree"] is True
    c = compare(a, e, None)
    assert (c.nmse, c.rel_diff, c.cosine, c.beyond) == (m["nmse"], m["rel_diff"], m["cosine"], m["beyond"])


def test_a_nan_or_infinity_the_oracle_lacks_fails_every_metric_but_equal_bits() -> None:
    a, e = torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])
    for text in ("nmse:1", "cosine:0", "max_abs:1e9", "beyond:1", "rel_diff:1"):
        c = compare(a, e, None)
        c.judged_by(metrics.parse(text))
        assert not c.passed, text
    same = compare(a, a.clone(), None)
    same.judged_by(metrics.parse("nmse:0"))
    assert same.passed


@pytest.mark.parametrize("text, passes", [("nmse:2e-2", True), ("nmse:1e-2", False), ("cosine:0.99", True),
                                          ("cosine:0.9999", False), ("beyond:0.25", True), ("beyond:0.2", False),
                                          ("max_abs:0.5", True), ("max_rel:0.1", False), ("bitwise", False),
                                          ("ulp:1", False)])
def test_the_pass_rule_of_each_metric(text: str, passes: bool) -> None:
    c = compare(torch.tensor([1.0, 2.0, 0.0, 4.0]), torch.tensor([1.0, 2.5, 0.0, 4.0]), None)
    c.judged_by(metrics.parse(text))
    assert c.passed is passes and c.metric == str(metrics.parse(text))


@pytest.mark.parametrize("text", ["nmse", "nmse:-1", "nmse:nan", "cosine:x", "bitwise:3", "mse:1"])
def test_a_bad_metric_is_refused_naming_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="metric"):
        metrics.parse(text)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=16), st.floats(0, 0.3),
       st.sampled_from(["nmse:1e-4", "cosine:0.999", "rel_diff:1e-4", "max_abs:0.5", "max_rel:0.1", "beyond:0.2",
                        "bitwise"]))
def test_the_devices_verdict_is_the_hosts(values: list[float], noise: float, text: str) -> None:
    e = torch.tensor(values)
    a = e + noise * torch.linspace(-1, 1, len(values))
    metric = metrics.parse(text)
    c = compare(a, e, None)
    c.judged_by(metric)
    assert bool(metrics.holds_on_device(metric, a, e)) == c.passed


def test_replay_run_metric_decides_and_names_the_value() -> None:
    shipped = Path(__file__).parent.parent / "snapshots" / "prefill_001"
    strict = CliRunner().invoke(cli_main, ["run", str(shipped), "--op", "rmsnorm", "--metric", "nmse:1e-30"])
    assert strict.exit_code == 1 and "fails nmse:1e-30: nmse" in " ".join(strict.output.split())
    loose = CliRunner().invoke(cli_main, ["run", str(shipped), "--op", "rmsnorm", "--metric", "nmse:1e-9"])
    assert loose.exit_code == 0, loose.output
    # the kernel accumulates in fp32: further from float64 than the float64 reference, within a factor of 8
    assert CliRunner().invoke(cli_main, ["run", str(shipped), "--op", "rmsnorm", "--metric", "fp64:1"]).exit_code == 1
    assert CliRunner().invoke(cli_main, ["run", str(shipped), "--op", "rmsnorm", "--metric", "fp64:8"]).exit_code == 0
    bad = CliRunner().invoke(cli_main, ["run", str(shipped), "--metric", "nmse"])
    assert bad.exit_code == 2 and "needs a bound" in bad.output


def test_replay_diff_metric(tmp_path: Path) -> None:
    from replay_kernels.model import TinyLlama

    for name, scale in (("a", 1.0), ("b", 1.0 + 1e-6)):
        model = TinyLlama(device="cuda" if torch.cuda.is_available() else "cpu")
        model.weights.out_norm *= scale
        with replay.recording(tmp_path / name):
            model.prefill([3, 4])
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert CliRunner().invoke(cli_main, ["diff", a, b]).exit_code == 1
    assert CliRunner().invoke(cli_main, ["diff", a, b, "--metric", "nmse:1e-9"]).exit_code == 0
    assert CliRunner().invoke(cli_main, ["diff", a, b, "--metric", "fp64:2"]).exit_code == 2


def test_verify_with_a_metric_checks_by_it(tmp_path: Path) -> None:
    seen: list = []
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True)

    @replay.verify(reference=lambda x: x * 2, sample=1.0, metric="nmse:1e-4", outliers=False, on_mismatch=seen.append)
    def nearly_double(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 0.1

    try:
        nearly_double(torch.full((8,), 100.0))  # nmse 2.5e-7: passes, though 5e-4 off element by element
        nearly_double(torch.ones(8))  # nmse 2.5e-3: fails
        replay.verify.drain()
    finally:
        replay.verify.stop(next(n for n in all_ops() if n.endswith("nearly_double")))
    assert [(m.call, m.output) for m in seen] == [(1, "out")]
    with pytest.raises(ValueError, match="cannot be decided"):
        replay.verify(reference=lambda x: x, metric="fp64:2")(lambda x: x)



def test_verify_decides_a_metric_the_device_cannot_on_the_workers_host(tmp_path: Path) -> None:
    seen: list = []
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True)

    @replay.verify(reference=lambda x: x + 1, sample=1.0, metric="ulp:0", outliers=False, on_mismatch=seen.append)
    def plus_one_nearly(x: torch.Tensor) -> torch.Tensor:
        return torch.nextafter(x + 1, torch.full_like(x, math.inf))  # one ulp off

    try:
        plus_one_nearly(torch.ones(4))
        replay.verify.drain()
    finally:
        replay.verify.stop(next(n for n in all_ops() if n.endswith("plus_one_nearly")))
    assert [(m.call, m.output) for m in seen] == [(0, "out")]
