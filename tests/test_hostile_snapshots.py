"""A snapshot is untrusted input: every hostile file is exit 2 and one line naming it, in bounded time
and memory; nothing a snapshot says makes replay import code the user did not trust."""
from __future__ import annotations

import json
import os
import pty
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
from replay.cli import main
from replay.summary import tensor_stats
from replay.snapshot import Snapshot

MAX_SECONDS = 20
MAX_GROWTH_BYTES = 400 << 20


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile.record(tmp_path_factory.mktemp("hostile") / "snap")


@pytest.fixture
def snapshot(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "snap"
    shutil.copytree(pristine, copy)
    return copy


def replay(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def bounded(command: tuple[str, ...]) -> Result:
    """Run a command in process; it must end in MAX_SECONDS with peak memory up by MAX_GROWTH_BYTES at most."""
    before, started = peak_rss_bytes(), time.monotonic()
    result = replay(*command)
    assert time.monotonic() - started < MAX_SECONDS, command
    assert peak_rss_bytes() - before < MAX_GROWTH_BYTES, command
    return result


def assert_one_line_error(result: Result, names: Path, says: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error: "), result.stderr
    assert str(names) in lines[0] and says in lines[0], lines[0]


def test_the_pristine_recording_reads_and_replays(pristine: Path) -> None:
    assert replay("show", str(pristine)).exit_code == 0
    result = replay("run", str(pristine), "--provider", hostile.PROVIDER)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", list(hostile.HOSTILE))
def test_hostile_file_is_exit_2_with_one_line_naming_it(case: str, snapshot: Path) -> None:
    mutate, says = hostile.HOSTILE[case]
    damaged = mutate(snapshot)
    for command in (("show", str(snapshot)), ("run", str(snapshot), "--provider", hostile.PROVIDER)):
        assert_one_line_error(bounded(command), damaged, says)


def test_a_far_storage_offset_costs_no_memory(snapshot: Path) -> None:
    hostile.edit_call(hostile.geometry("in/x", storage_offset=2 * 10 ** 9))(snapshot)
    result = bounded(("show", str(snapshot), "--json", "-"))
    assert result.exit_code == 0, result.output
    # the zeros before the offset are not made (the view keeps its alignment, 256 bytes); show says what was recorded
    assert json.loads(result.stdout)["calls"][0]["tensors"][0]["storage_offset"] == 2 * 10 ** 9
    record = Snapshot(snapshot).load(0)
    assert record.tensors["in/x"].storage_offset() == 2 * 10 ** 9 % 64 and record.recorded_offsets["in/x"] == 2 * 10 ** 9


def test_statistics_of_a_broadcast_view_do_not_expand_it(snapshot: Path) -> None:
    hostile.edit_call(hostile.geometry("state/position_buf", shape=[2 ** 20, 4], stride=[0, 1]))(snapshot)
    result = bounded(("show", str(snapshot), "--role", "state", "--json", "-"))
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)["calls"][0]["tensors"]
    assert (summary["numel"], summary["min"], summary["max"], summary["mean"]) == (2 ** 22, 0, 3, 1.5)
    # a view no memory could expand: statistics over one copy of its elements, counts scaled
    huge = torch.as_strided(torch.tensor([1.0, float("nan"), float("inf"), 3.0]), (2 ** 40, 4), (0, 1))
    stats = tensor_stats(huge)
    assert (stats["min"], stats["max"], stats["mean"], stats["nan"], stats["inf"]) == (1.0, 3.0, 2.0, 2 ** 40, 2 ** 40)


@pytest.mark.parametrize("provider", ["this", "venv.__main__", "os", "hostile_not_trusted"])
def test_a_snapshot_cannot_choose_the_code_that_runs(provider: str, snapshot: Path) -> None:
    damaged = hostile.edit_call(lambda call: call.update(provider=provider))(snapshot)
    result = bounded(("run", str(snapshot), "--json", "-"))
    assert_one_line_error(result, snapshot, f"provider module '{provider}' is not trusted")
    assert f"--provider {provider.split('.')[0]}" in result.stderr and damaged.exists()
    assert "Zen of Python" not in result.output


def test_a_provider_is_trusted_when_the_user_names_it(snapshot: Path) -> None:
    assert replay("run", str(snapshot)).exit_code == 2  # the test module declares no entry point
    assert replay("run", str(snapshot), "--provider", hostile.PROVIDER).exit_code == 0


@pytest.mark.parametrize("option", ["--atol", "--rtol"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf", "abc"])
def test_tolerances_that_would_turn_checks_off_are_refused(option: str, value: str, snapshot: Path) -> None:
    for command in (("run", str(snapshot), "--golden-data", "--provider", hostile.PROVIDER), ("diff", str(snapshot),
                                                                                              str(snapshot))):
        result = replay(*command, option, value)
        assert result.exit_code == 2 and option in result.stderr, result.output


@pytest.mark.parametrize("poison", ["0000c07f", "0000807f", "000080ff"], ids=["nan", "inf", "-inf"])
def test_tampered_outputs_never_pass_on_non_finite_arithmetic(poison: str, snapshot: Path) -> None:
    def poisoned(header: dict, body: bytes) -> tuple[dict, bytes]:
        begin, end = header["c000000/out/out"]["data_offsets"]
        return header, body[:begin] + bytes.fromhex(poison) * ((end - begin) // 4) + body[end:]
    hostile.edit_call_file(poisoned)(snapshot)
    result = replay("run", str(snapshot), "--golden-data", "--rtol", "1", "--atol", "1e30", "--provider",
                    hostile.PROVIDER, "--json", "-")
    assert result.exit_code == 1, result.output


def test_json_to_an_unwritable_path_is_exit_2(snapshot: Path, tmp_path: Path) -> None:
    result = replay("show", str(snapshot), "--json", str(tmp_path / "no" / "such" / "dir" / "r.json"))
    assert result.exit_code == 2 and "cannot write the JSON report" in result.stderr


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.text(max_size=6)
                           | st.floats(allow_nan=False, allow_infinity=False) | st.just("OVERFLOW"),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3),
                           max_leaves=8)
MANIFEST_FIELDS = ["format_version", "created", "producer", "environment", "notes", "capture_errors"]
INDEX_FIELDS = ["index", "op", "variant", "file", "sha256", "bytes", "blobs"]
CALL_FIELDS = ["op", "variant", "provider", "index", "args", "tensors", "returns_json", "launch", "meta"]
GEOMETRY_FIELDS = ["dtype", "shape", "stride", "storage_offset", "blob"]
ARGUMENT_FIELDS = ["name", "tensor", "json"]


def set_field(field: str, value: object):
    return lambda document: document.update({field: value})


def edit_inside(key: str) -> Callable[[Callable[[dict], object]], Callable[[Path], Path]]:
    """An edit of a tensor's geometry ("tensors") or of the first argument ("args") of the first call."""
    def within(edit: Callable[[dict], object]) -> Callable[[Path], Path]:
        return hostile.edit_call(lambda call: edit(call["tensors"]["in/x"] if key == "tensors" else call["args"][0]))
    return within


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["manifest", "index", "call", "geometry", "argument"]), field=st.data(),
       value=json_values)
def test_any_json_shape_is_a_verdict_or_exit_2_never_a_traceback(where: str, field: st.DataObject, value: object,
                                                          pristine: Path, tmp_path_factory: pytest.TempPathFactory,
                                                          ) -> None:
    snapshot = tmp_path_factory.mktemp("shape") / "snap"
    shutil.copytree(pristine, snapshot)
    fields = {"manifest": MANIFEST_FIELDS, "index": INDEX_FIELDS, "call": CALL_FIELDS, "geometry": GEOMETRY_FIELDS,
              "argument": ARGUMENT_FIELDS}[where]
    name = field.draw(st.sampled_from(fields))
    edit = {"manifest": hostile.edit_manifest, "index": hostile.edit_index, "call": hostile.edit_call,
            "geometry": edit_inside("tensors"), "argument": edit_inside("args")}[where]
    edit(set_field(name, value))(snapshot)
    for command in (("show", str(snapshot)), ("run", str(snapshot), "--provider", hostile.PROVIDER)):
        result = replay(*command)
        # 125: arguments the recorded function does not take make a call this code cannot make
        assert result.exit_code in (0, 1, 2, 125), (command, result.output)
        assert "Traceback" not in result.output and "internal error" not in result.output, result.output
        assert len(result.stderr.strip().splitlines()) <= 1, result.stderr


@pytest.mark.parametrize("raised, code, says", [(KeyboardInterrupt(), 130, "replay: interrupted"),
                                                (ZeroDivisionError("boom"), 70, "replay: internal error (a bug in "
                                                                                "kernel-replay")])
def test_interrupts_and_bugs_have_exit_codes_of_their_own(raised: BaseException, code: int, says: str,
                                                          pristine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise raised
    monkeypatch.setattr("replay.engine.session._run_and_check", fail)
    result = replay("run", str(pristine), "--provider", hostile.PROVIDER)
    assert result.exit_code == code and result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(says) and "Traceback" not in result.output


def test_the_code_a_tree_holds_is_trusted_but_not_its_scripts(snapshot: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "ops.py").write_text("import replay\nreplay.op('tree_op')\nraise SystemExit('ops.py ran')\n")
    (tree / "deploy.py").write_text(f"open({str(tmp_path / 'DEPLOYED')!r}, 'w')\n")
    for provider in ("replay.__main__", "deploy"):  # the harness; a script that declares no op
        hostile.edit_call(lambda call: call.update(provider=provider))(snapshot)
        result = replay("run", str(snapshot), "--code", str(tree))
        assert_one_line_error(result, snapshot, f"provider module '{provider}' is not trusted")
    assert not (tmp_path / "DEPLOYED").exists()
    for provider in ("pkg", "ops"):  # a package; a loose module declaring ops
        hostile.edit_call(lambda call: call.update(provider=provider))(snapshot)
        result = replay("run", str(snapshot), "--code", str(tree), "--call", "0")
        assert "is not trusted" not in result.stderr
    # a module that exits as it is imported is code that cannot be tested, not the end of replay
    assert result.exit_code == 125 and "provider module 'ops' failed to import: SystemExit: ops.py ran" in \
        result.stderr


def test_python_m_replay_does_not_import_providers_from_the_working_directory(tmp_path: Path) -> None:
    # the shipped snapshot names replay_kernels.*, a trusted name; a replay_kernels/ where replay runs must not be it
    planted = tmp_path / "replay_kernels"
    planted.mkdir()
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('planted code ran')\n")
    shipped = Path(__file__).resolve().parents[1] / "snapshots" / "prefill_001"
    done = subprocess.run([sys.executable, "-m", "replay", "run", str(shipped), "--call", "0", "--variant", "batched",
                           "--json", "-"], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert not (tmp_path / "ran").exists(), done.stderr
    assert done.returncode == 0, done.stderr


def test_an_escape_sequence_in_a_name_is_printed_as_its_escape(snapshot: Path) -> None:
    hostile.edit_call(lambda call: call.update(op="x\x1b[2J\x1b]0;owned\x07"))(snapshot)
    hostile.edit_index(lambda entry: entry.update(op="x\x1b[2J\x1b]0;owned\x07"))(snapshot)
    for command in (("show", str(snapshot)), ("run", str(snapshot), "--provider", hostile.PROVIDER)):
        result = replay(*command)
        assert "\x1b" not in result.output and "\x07" not in result.output, result.output
        assert "x\\x1b[2J" in result.output, result.output  # shown as it is written


def test_the_progress_bar_shows_a_name_as_it_is_written(snapshot: Path) -> None:
    """On a terminal the progress bar names each call: an escape sequence in the name is printed as
    its escape, and brackets in it are no markup."""
    for name in ("x\x1b]0;owned\x07", "[/bold] x"):
        hostile.edit_call(lambda call: call.update(op=name))(snapshot)
        hostile.edit_index(lambda entry: entry.update(op=name))(snapshot)
        leader, follower = pty.openpty()
        child = subprocess.Popen([sys.executable, "-m", "replay", "run", str(snapshot), "--provider", hostile.PROVIDER,
                                  "--call", "0"], stdin=follower, stdout=follower, stderr=follower,
                                 env={**os.environ, "PYTHONPATH": str(Path(hostile.__file__).parent)})
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the child is gone and its side of the terminal closed
                break
            if not chunk:
                break
            shown += chunk
        os.close(leader)
        assert child.wait(timeout=60) == 125, shown  # the op is no longer the provider's: untestable
        assert b"\x1b]0;owned" not in shown and b"internal error" not in shown, shown
