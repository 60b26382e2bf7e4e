"""A damaged snapshot gives `replay show` exit code 2 and one stderr line naming the file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import safetensors.torch
from click.testing import CliRunner

from fixtures.make_fixture_snapshot import make_fixture_snapshot
from replay.cli import main
from replay.snapshot import FORMAT_VERSION
from replay.snapshot.files import sha256_bytes


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fixture_snapshot(tmp_path_factory.mktemp("fixture") / "snap")


@pytest.fixture
def snapshot(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "snap"))


def index(snapshot: Path) -> list[dict]:
    return [json.loads(line) for line in (snapshot / "calls.jsonl").read_text().splitlines()]


def first_call_file(snapshot: Path) -> Path:
    return snapshot / index(snapshot)[0]["file"]


def first_blob(snapshot: Path) -> Path:
    return snapshot / "blobs" / f"{next(line['blobs'][0] for line in index(snapshot) if line['blobs'])}.safetensors"


def rewrite_indexed(snapshot: Path, path: Path, data: bytes) -> None:
    """Replace a call file and fix its index line, so only the content is wrong, not the hash."""
    path.write_bytes(data)
    lines = index(snapshot)
    for line in lines:
        if snapshot / line["file"] == path:
            line.update(sha256=sha256_bytes(data), bytes=len(data))
    (snapshot / "calls.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def flip_byte(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[:-100])
    return path


def delete_manifest(snapshot: Path) -> Path:
    (snapshot / "manifest.json").unlink()
    return snapshot / "manifest.json"


def future_version(snapshot: Path) -> Path:
    path = snapshot / "manifest.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), format_version=FORMAT_VERSION + 1)))
    return path


def unknown_dtype_in_call_metadata(snapshot: Path) -> Path:
    path = first_call_file(snapshot)
    data = path.read_bytes()
    metadata = safetensors.safe_open(path, "pt").metadata()
    key = index(snapshot)[0]["call"] + "replay.call"  # the first call's description, in its segment
    call = json.loads(metadata[key])
    next(iter(call["tensors"].values()))["dtype"] = "float128"
    rewrite_indexed(snapshot, path, safetensors.torch.save(safetensors.torch.load(data),
                                                           metadata={**metadata, key: json.dumps(call)}))
    return path


def unknown_dtype_in_safetensors_header(snapshot: Path) -> Path:
    path = first_call_file(snapshot)
    data = path.read_bytes()
    assert b'"dtype":"BF16"' in data
    rewrite_indexed(snapshot, path, data.replace(b'"dtype":"BF16"', b'"dtype":"BF99"', 1))
    return path


def missing_call_file(snapshot: Path) -> Path:
    path = first_call_file(snapshot)
    path.unlink()
    return path


def garbage_index_line(snapshot: Path) -> Path:
    with open(snapshot / "calls.jsonl", "a") as f:
        f.write("{not json\n")
    return snapshot / "calls.jsonl"


DAMAGES: dict[str, Callable[[Path], Path]] = {
    "flipped byte in a call file": lambda s: flip_byte(first_call_file(s)),
    "truncated call file": lambda s: truncate(first_call_file(s)),
    "flipped byte in a blob": lambda s: flip_byte(first_blob(s)),
    "deleted manifest": delete_manifest,
    "future format version": future_version,
    "unknown dtype in call metadata": unknown_dtype_in_call_metadata,
    "unknown dtype in safetensors header": unknown_dtype_in_safetensors_header,
    "missing call file": missing_call_file,
    "garbage index line": garbage_index_line,
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_damage_is_one_line_naming_the_file_and_exit_2(damage: str, snapshot: Path) -> None:
    damaged_file = DAMAGES[damage](snapshot)
    result = CliRunner().invoke(main, ["show", str(snapshot)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("replay: error: ")
    assert str(damaged_file) in result.stderr


def test_undamaged_fixture_shows(snapshot: Path) -> None:
    result = CliRunner().invoke(main, ["show", str(snapshot)])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
