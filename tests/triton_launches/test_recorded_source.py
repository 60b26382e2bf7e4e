"""A kernel generated at run time (as torch.compile writes its kernels into a cache directory and
loads them by file): recorded with its module's text, which is code, so replaying it needs
`--trust-recorded-source`, and runs from the snapshot after the cache is gone."""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import replay
from replay.cli import main
from replay.snapshot.reader import Snapshot

GENERATED = '''
import triton
import triton.language as tl

SCALE = tl.constexpr(3.0)  # a module-level constant, as generated code has


@triton.jit
def triton_poi_fused_mul_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * SCALE, xmask)
'''


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args])
    return result.exit_code, " ".join(result.output.split())


def test_a_generated_kernel_replays_only_from_trusted_recorded_source(tmp_path: Path, device: str) -> None:
    cache = tmp_path / "inductor-cache"
    cache.mkdir()
    (cache / "cq7generated.py").write_text(GENERATED)
    spec = importlib.util.spec_from_file_location("cq7generated", cache / "cq7generated.py")
    assert spec is not None and spec.loader is not None
    generated = importlib.util.module_from_spec(spec)
    sys.modules["cq7generated"] = generated
    spec.loader.exec_module(generated)
    x = torch.arange(10.0, device=device)
    out = torch.empty_like(x)
    with replay.recording(tmp_path / "snap"):
        generated.triton_poi_fused_mul_0[(1,)](x, out, 10, XBLOCK=16)
    (call,) = Snapshot(tmp_path / "snap")
    assert call.triton["generated"] and torch.equal(call.role("out")["out_ptr0"], (x * 3).cpu())
    del sys.modules["cq7generated"]
    (cache / "cq7generated.py").unlink()  # the cache removed

    code, said = run(str(tmp_path / "snap"))
    assert code == 2 and "its source, which is code: run it with --trust-recorded-source" in said
    code, said = run(str(tmp_path / "snap"), "--trust-recorded-source", "--json", "-")
    assert code == 0 and json.loads(said)["passed"], said

    stored = tmp_path / "snap" / "sources" / f"{call.triton['module_source_sha256']}.py"
    stored.write_text(stored.read_text().replace("tl.constexpr(3.0)", "tl.constexpr(4.0)"))  # tampered with
    code, said = run(str(tmp_path / "snap"), "--trust-recorded-source")
    assert code == 2 and "sha256 mismatch" in said


def test_a_module_an_import_finder_serves_is_not_generated(tmp_path: Path, device: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # an editable install serves its packages through a finder on sys.meta_path, not sys.path
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "mkserved.py").write_text(GENERATED)

    class Served(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "mkserved":
                return None
            return importlib.util.spec_from_file_location(name, tmp_path / "served" / "mkserved.py")

    monkeypatch.setattr(sys, "meta_path", [Served(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "mkserved", raising=False)
    import mkserved  # type: ignore[import-not-found]

    x = torch.arange(10.0, device=device)
    with replay.recording(tmp_path / "snap"):
        mkserved.triton_poi_fused_mul_0[(1,)](x, torch.empty_like(x), 10, XBLOCK=16)
    (call,) = Snapshot(tmp_path / "snap")
    assert "generated" not in call.triton and call.provider == "mkserved"
