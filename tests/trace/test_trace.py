"""`replay trace` on a recording of the tiny model's prefill and four decode steps: the timeline by
step and layer, its Chrome trace (checked against the trace-event format) and its HTML page (opened
in headless Chromium)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import replay
from replay_kernels.model import TinyLlama, prompt_tokens
from replay.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROMPT, DECODE_STEPS = 4, 4


@pytest.fixture(scope="module")
def generation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "gen"
    model = TinyLlama(seed=0)
    with replay.recording(path):
        model.generate(prompt_tokens(PROMPT, 0), DECODE_STEPS + 1)  # the prefill gives the first token
    return path


def trace(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["trace", *args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def test_the_timeline_has_each_step_and_layer_and_which_path_each_scatter_took(generation: Path) -> None:
    code, report = trace(str(generation))
    assert code == 0
    calls = report["calls"]
    assert sorted({c["scope"]["step"] for c in calls}) == list(range(1 + DECODE_STEPS))
    assert {c["scope"].get("layer") for c in calls} == {0, 1, None}  # None: the final norm and lm_head
    scatters = [c for c in calls if c["op"] == "kv_scatter"]
    paths = [(c["scope"]["step"], c["launches"][0]["path"]) for c in scatters]
    assert paths == [(0, "direct")] * 2 + [(s, "indirect") for s in range(1, 1 + DECODE_STEPS) for _ in range(2)]
    first_decode = next(c for c in scatters if c["scope"]["step"] == 1)
    assert first_decode["params"]["seq_len_buf"] == [1] and first_decode["params"]["kv_cache_lengths"] == [PROMPT]
    assert first_decode["params"]["position_buf"]["first"][0] == PROMPT
    timed = [c for c in calls if c["duration_s"] is not None]  # a call replayed in a CUDA graph has no duration
    assert timed and all(c["start_s"] >= 0 for c in calls) and all(c["duration_s"] > 0 for c in timed)
    code, layer_one = trace(str(generation), "--layer", "1", "--step", "2", "--op", "rope")
    assert [(c["scope"]["layer"], c["scope"]["step"], c["op"]) for c in layer_one["calls"]] == [(1, 2, "rope")] * 2


def test_the_chrome_trace_keeps_the_trace_event_format_and_nests(generation: Path, tmp_path: Path) -> None:
    code, report = trace(str(generation), "--chrome", str(tmp_path / "t.json"))
    document = json.loads((tmp_path / "t.json").read_text())
    events = document["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["ph"] for e in events} == {"M", "X"}
    for event in complete:  # the fields a complete event must have, of the right types
        assert isinstance(event["name"], str) and isinstance(event["cat"], str)
        assert event["ts"] >= 0 and event["dur"] > 0 and event["pid"] == 1 and event["tid"] == 1
        json.dumps(event["args"], allow_nan=False)
    # one thread: complete events must nest (a stack), steps > layers > calls > kernels
    order = {"step": 0, "layer": 1, "call": 2, "kernel": 3}
    stack: list[dict] = []
    for event in complete:
        while stack and event["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 1e-6:
            stack.pop()
        if stack:
            parent = stack[-1]
            assert event["ts"] + event["dur"] <= parent["ts"] + parent["dur"] + 1e-6, (event, parent)
            assert order[event["cat"].split(",")[0]] > order[parent["cat"].split(",")[0]]
        stack.append(event)
    kinds = [e["cat"].split(",")[0] for e in complete]
    launches = sum(len(c["launches"]) for c in report["calls"])
    assert kinds.count("kernel") == launches and kinds.count("call") == len(report["calls"])
    assert kinds.count("step") == 1 + DECODE_STEPS and kinds.count("layer") == 2 * (1 + DECODE_STEPS)


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian's chromium package)")
def test_the_html_page_draws_every_kernel_in_headless_chromium(generation: Path, tmp_path: Path) -> None:
    report_file = tmp_path / "run.json"
    report_file.write_text(json.dumps({"calls": [{"index": 6, "passed": False}, {"index": 7, "passed": True}]}))
    code, report = trace(str(generation), "--html", str(tmp_path / "t.html"), "--report", str(report_file))
    assert code == 0 and report["failing_calls"] == [6]
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", (tmp_path / "t.html").as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    launches = sum(len(c["launches"]) for c in report["calls"])
    slices = launches + len(report["calls"]) + 3 * (1 + DECODE_STEPS)  # kernels, calls, steps and layers
    assert re.search(r'data-rendered="(\d+)"', dom).group(1) == str(slices)
    assert dom.count('data-kind="kernel"') == launches
    assert "failing call: kv_scatter batched" in dom


def test_a_report_that_is_not_one_is_a_clear_error(generation: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(main, ["trace", str(generation), "--report", str(bad)])
    assert result.exit_code == 2 and "not a `replay run --json` report" in result.stderr


def test_registers_of_interpreter_launches_come_from_compiling_for_a_target(generation: Path) -> None:
    code, report = trace(str(generation), "--op", "kv_scatter", "--step", "0", "--resources", "sm_90")
    launches = [launch for call in report["calls"] for launch in call["launches"]]
    # a GPU reports them at launch; the interpreter does not, so they are compiled for, and marked so
    marked = None if torch.cuda.is_available() else "compiled for sm_90 (no GPU)"
    assert launches and all(launch["registers"] > 0 and launch.get("resources_from") == marked
                            for launch in launches)


def test_an_output_that_cannot_be_written_is_exit_2(generation: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["trace", str(generation), "--html", str(tmp_path / "no" / "such" / "t.html")])
    assert result.exit_code == 2 and "cannot write" in result.stderr


def test_scope_labels_must_be_finite_and_a_missing_pointer_is_no_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="finite"):
        with replay.scope("step", float("nan")):
            pass
    from replay import context

    with context.collecting(arguments={"x": torch.zeros(2)}) as sink:
        replay.record_launch("k", (1,), pointers={"x_ptr": None, "y_ptr": torch.zeros(1)})
    assert "binds" not in sink.launches[0]
