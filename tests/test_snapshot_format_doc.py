"""docs/FORMAT.md is right: its example producer's snapshot reads back, its dtype table matches."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import safetensors.torch
import torch
from click.testing import CliRunner

from replay.cli import main
from replay.snapshot import Snapshot
from replay.snapshot.tensors import DTYPES

FORMAT_MD = (Path(__file__).parents[1] / "docs" / "FORMAT.md").read_text()


def example_producer() -> dict:
    """Run the worked example's code blocks (version 1, the chunked call of version 2, the segment
    of version 4, the output buffer of version 5, the edited chunk list of version 6) and return
    their namespace."""
    namespace: dict = {}
    for defines in ("def write_minimal_snapshot", "def add_chunked_call", "def write_segment_snapshot",
                    "def write_output_buffer_snapshot", "def write_edited_list_snapshot"):
        (code,) = [block for block in re.findall(r"```python\n(.*?)```", FORMAT_MD, re.S) if defines in block]
        exec(compile(code, "docs/FORMAT.md", "exec"), namespace)
    return namespace


def test_the_documented_chunked_call_of_version_2_reads_back(tmp_path: Path) -> None:
    producer = example_producer()
    producer["write_minimal_snapshot"](tmp_path / "example")
    producer["add_chunked_call"](tmp_path / "example")
    snapshot = Snapshot(tmp_path / "example")
    assert snapshot.manifest["format_version"] == 2 and len(snapshot) == 2
    assert snapshot.load(1).tensors["in/x"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert snapshot.load(0).tensors["in/w"].tolist() == [[1.0, 3.0], [2.0, 4.0]]  # version 1's call unchanged


def test_the_documented_segment_of_version_4_reads_back_and_replays(tmp_path: Path) -> None:
    example_producer()["write_segment_snapshot"](tmp_path / "example")
    snapshot = Snapshot(tmp_path / "example")
    assert snapshot.manifest["format_version"] == 4 and len({e.file for e in snapshot.entries}) == 1
    assert [(r.index, r.tensors["in/x"].tolist(), r.tensors["out/out"].tolist()) for r in snapshot] == \
        [(0, [1.0, 2.0], [2.0, 4.0]), (1, [3.0, 4.0], [6.0, 8.0])]
    assert CliRunner().invoke(main, ["show", str(tmp_path / "example")]).exit_code == 0


def test_the_documented_edited_chunk_list_of_version_6_reads_back(tmp_path: Path) -> None:
    example_producer()["write_edited_list_snapshot"](tmp_path / "example")
    snapshot = Snapshot(tmp_path / "example")
    call = snapshot.load(0)
    assert snapshot.manifest["format_version"] == 6
    assert call.tensors["in/cache"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert call.tensors["out/cache"].tolist() == [1.0, 2.0, 5.0, 6.0]
    assert CliRunner().invoke(main, ["show", str(tmp_path / "example")]).exit_code == 0


def test_the_documented_output_buffer_of_version_5_is_made_from_its_call(tmp_path: Path) -> None:
    example_producer()["write_output_buffer_snapshot"](tmp_path / "example")
    snapshot = Snapshot(tmp_path / "example")
    call = snapshot.load(0)
    assert snapshot.manifest["format_version"] == 5 and "kept/out" not in call.tensors
    before = call.tensors["in/out"]
    assert before[3].item() == 7.0 and before[:3].isnan().all()  # kept where unchanged, 0xFF bytes elsewhere
    assert before.view(torch.int32)[:3].tolist() == [-1, -1, -1]
    assert call.overwritten("in/out").tolist() == [True, True, True, False] and call.overwritten("out/out") is None
    shown = CliRunner().invoke(main, ["show", str(tmp_path / "example")])
    assert shown.exit_code == 0
    # the filler is not shown as NaNs the call was given: the buffer is marked, its statistics are the kept element's
    assert "out†" in shown.output and "† an output buffer before its call" in shown.output
    described = CliRunner().invoke(main, ["show", str(tmp_path / "example"), "--json", "-"])
    (buffer,) = [t for t in json.loads(described.output)["calls"][0]["tensors"] if t["role"] == "in" and t["name"] == "out"]
    assert (buffer["overwritten"], buffer["nan"], buffer["min"], buffer["max"], buffer["numel"]) == (3, 0, 7.0, 7.0, 4)


def test_snapshot_written_by_the_documented_producer_reads_back(tmp_path: Path) -> None:
    example_producer()["write_minimal_snapshot"](tmp_path / "example")
    snapshot = Snapshot(tmp_path / "example")
    assert snapshot.manifest["notes"] == "FORMAT.md example"
    (call,) = list(snapshot)
    assert (call.op, call.variant, call.provider) == ("axpy", "single", "example_kernels")
    w = call.tensors["in/w"]
    assert (w.stride(), w.tolist()) == ((1, 2), [[1.0, 3.0], [2.0, 4.0]])
    row = call.tensors["in/row"]
    assert (row.storage_offset(), row.tolist()) == (2, [7.0, 8.0])
    assert torch.as_strided(row, (2,), (1,), 0).tolist() == [0.0, 0.0]  # not stored: zero
    assert torch.equal(call.role("state")["position_buf"], torch.tensor([5, 6], dtype=torch.int32))
    assert call.tensors["out/out"].tolist() == [2.0, 4.0, 6.0]
    args = call.arguments()
    assert math.isinf(args["alpha"]) and args["grid"] == (1, 2.0) and isinstance(args["grid"][1], float)
    assert call.blobs == {"in/w": snapshot.entries[0].blobs[0]}
    assert call.launch == [{"kernel": "axpy_kernel", "grid": [1, 1, 1]}]
    assert CliRunner().invoke(main, ["show", str(tmp_path / "example")]).exit_code == 0


def test_dtype_table_matches_the_reader_and_safetensors() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (\d) \|$", FORMAT_MD, re.M)
    assert {name for name, _, _ in rows} == set(DTYPES)
    for name, code, size in rows:
        data = safetensors.torch.save({"t": torch.zeros(1, dtype=DTYPES[name])})
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        assert header["t"]["dtype"] == code, name
        assert torch.empty(0, dtype=DTYPES[name]).element_size() == int(size), name
