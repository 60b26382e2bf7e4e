"""Atomic writes and path-safe names."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.snapshot import files
from replay.snapshot.files import safe_component


def test_failed_atomic_write_leaves_neither_target_nor_temporary(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(OSError):
        files.write_atomic(tmp_path / "call.safetensors", b"data")
    assert os.listdir(tmp_path) == []


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    files.write_atomic(target, b"old contents, longer")
    files.write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["manifest.json"]


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=120))
def test_safe_component_is_one_harmless_path_component(name: str) -> None:
    safe = safe_component(name)
    assert 0 < len(safe) <= 80
    assert ".." not in safe and not safe.startswith(".")
    assert all(c.isascii() and (c.isalnum() or c in "_.+=-") for c in safe)
    assert Path(safe).name == safe


@pytest.mark.parametrize("name, expected", [("../../etc/passwd", "_._etc_passwd"), ("a/b\\c", "a_b_c"),
                                            ("x\x00\n\ty", "x___y"), ("..", "_"), ("rms_norm.v2", "rms_norm.v2")])
def test_safe_component_examples(name: str, expected: str) -> None:
    assert safe_component(name) == expected
