"""The door patches Inductor's launcher when the program imports it, not before (after_import.py)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from replay.triton_launches.after_import import when_imported


@pytest.fixture
def module_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "watched_mod_a1.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "watched_mod_a1"
    sys.modules.pop("watched_mod_a1", None)


def test_the_callback_runs_once_the_program_imports_the_module(module_file: str) -> None:
    seen: list[ModuleType] = []
    when_imported(module_file, seen.append)
    assert not seen and module_file not in sys.modules  # nothing imported on its behalf
    module = importlib.import_module(module_file)
    assert seen == [module] and module.VALUE == 1
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # its own loader, as if unwatched
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)


def test_an_imported_module_is_handed_over_at_once(module_file: str) -> None:
    module = importlib.import_module(module_file)
    seen: list[ModuleType] = []
    when_imported(module_file, seen.append)
    assert seen == [module]


def test_stopping_before_the_import_leaves_it_alone(module_file: str) -> None:
    seen: list[ModuleType] = []
    stop = when_imported(module_file, seen.append)
    stop()
    importlib.import_module(module_file)
    assert not seen and not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
