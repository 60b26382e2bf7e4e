"""Snapshots at fsspec URLs (replay/storage): read through the local cache by digest and checked
by the unchanged reader, uploaded manifest last; memory:// is one process's, so its commands run
in-process (CliRunner)."""
from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import replay
from replay.cli import main
from replay.errors import SnapshotError
from replay.storage import as_url, is_url, local_snapshot, upload_snapshot

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402 (fsspec is an optional extra)
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

CHUNK = 1 << 16  # pieces of the state (the recorder's size), so that it is stored in packs


@replay.capture("storage_axpy_", mutates=("state",))
def axpy_(state: torch.Tensor, weight: torch.Tensor, factor: float) -> None:
    state.add_(weight * factor)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three calls in segments, a weight stored once as a blob, a 256 KiB state in packs."""
    path = tmp_path_factory.mktemp("storage") / "snap"
    gen = torch.Generator().manual_seed(0)
    weight, state = torch.randn(CHUNK, generator=gen), torch.zeros(CHUNK)
    with replay.recording(path, asynchronous=False, chunk_threshold=CHUNK):
        for n in range(3):
            axpy_(state, weight, float(n))
    assert all(any((path / folder).iterdir()) for folder in ("segments", "blobs", "packs"))
    return path


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REPLAY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def memory_url() -> str:
    return f"memory://storage-tests/{uuid.uuid4().hex}/snap"


def uploaded(local: Path, url: str) -> str:
    upload_snapshot(local, url)
    return url


def replay_cli(*args: str) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def run_report(location: str | Path) -> dict:
    result = replay_cli("run", str(location), "--provider", __name__, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for timed in (report, *report["calls"]):  # what differs from run to run
        for key in [k for k in timed if k.endswith("seconds")]:
            del timed[key]
    del report["snapshot"]
    return report


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_run_reads_a_url_as_it_reads_the_local_snapshot(local: Path, tmp_path: Path, scheme: str) -> None:
    url = memory_url() if scheme == "memory" else (tmp_path / "bucket" / "snap").as_uri()
    assert is_url(uploaded(local, url)) and not is_url(str(local))
    assert run_report(url) == run_report(local)


def test_show_reads_a_url(local: Path) -> None:
    url = uploaded(local, memory_url())
    result = replay_cli("show", url, "--json", "-")
    assert result.exit_code == 0, result.output
    assert [c["op"] for c in json.loads(result.stdout)["calls"]] == ["storage_axpy_"] * 3


@pytest.mark.parametrize("folder", ["segments", "blobs", "packs"])
def test_a_tampered_file_in_the_store_is_refused_as_a_local_one_is(local: Path, tmp_path: Path, folder: str) -> None:
    url = uploaded(local, memory_url())
    fs, root = fsspec.core.url_to_fs(url)
    remote = sorted(fs.find(f"{root}/{folder}"))[0]
    rel = remote[len(root) + 1:]
    fs.pipe_file(remote, flip_last_byte(fs.cat_file(remote)))
    tampered = shutil.copytree(local, tmp_path / "tampered")
    (tampered / rel).write_bytes(flip_last_byte((tampered / rel).read_bytes()))
    said = []
    for location in (url, str(tampered)):  # the error names the file where the user put it
        result = replay_cli("run", location, "--provider", __name__)
        lines = result.stderr.splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and f"{location}/{rel}" in lines[0], result.output
        said.append(lines[0].replace(location, "SNAPSHOT"))
    assert said[0] == said[1] and "sha256 mismatch" in said[0]


def test_a_view_is_said_as_its_url_however_a_message_spells_its_path(local: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REPLAY_CACHE_DIR", "relative-cache")  # a relative cache: messages name it absolute
    url = uploaded(local, memory_url())
    view = local_snapshot(url)
    assert view.is_absolute()
    for spelled in (view, view.resolve()):
        assert as_url(f"{spelled}/calls.jsonl: line 3 damaged") == f"{url}/calls.jsonl: line 3 damaged"


def test_a_second_read_fetches_only_what_may_have_changed(local: Path) -> None:
    url = uploaded(local, memory_url())
    fetched: list[list[str]] = []
    for _ in range(2):
        fetched.append([])
        local_snapshot(url, progress=lambda done, total, rel: fetched[-1].append(rel))
    assert sorted(fetched[0]) == sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert sorted(fetched[1]) == ["calls.jsonl", "manifest.json"]
    copy = uploaded(local, memory_url())  # the same files elsewhere: only those not named by digest come again
    again: list[str] = []
    local_snapshot(copy, progress=lambda done, total, rel: again.append(rel))
    packs = [f"packs/{pack.name}" for pack in (local / "packs").iterdir()]
    assert sorted(again) == sorted(["calls.jsonl", "manifest.json", *packs])


def test_a_pack_changed_in_the_store_is_fetched_again(local: Path) -> None:
    url = uploaded(local, memory_url())
    view = local_snapshot(url)
    fs, root = fsspec.core.url_to_fs(url)
    pack = sorted(fs.find(f"{root}/packs"))[0]
    fs.pipe_file(pack, flip_last_byte(fs.cat_file(pack)))
    assert local_snapshot(url) == view
    assert (view / pack[len(root) + 1:]).read_bytes() == fs.cat_file(pack)


def test_an_index_naming_a_path_out_of_the_prefix_is_refused(local: Path) -> None:
    url = uploaded(local, memory_url())
    fs, root = fsspec.core.url_to_fs(url)
    line = {"index": 9, "op": "storage_axpy_", "variant": "default", "file": "../outside.safetensors",
            "sha256": "0" * 64, "bytes": 18, "blobs": []}
    fs.pipe_file(f"{root}/calls.jsonl", fs.cat_file(f"{root}/calls.jsonl") + (json.dumps(line) + "\n").encode())
    with pytest.raises(SnapshotError, match=f"^{url}/calls.jsonl: names '../outside.safetensors', outside"):
        local_snapshot(url)
    result = replay_cli("run", url)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and url in result.stderr


def test_a_stored_name_with_dot_dot_is_refused(local: Path) -> None:
    url = uploaded(local, memory_url())
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/blobs/../../outside.safetensors", b"an object store keeps such a name as it is")
    with pytest.raises(SnapshotError, match=f"^{url}: holds '.*\\.\\..*', a path that leads outside"):
        local_snapshot(url)


def test_a_remote_file_larger_than_the_reader_takes_is_not_fetched(local: Path, cache: Path) -> None:
    url = uploaded(local, memory_url())
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/manifest.json", b" " * ((16 << 20) + 1))
    with pytest.raises(SnapshotError, match=f"^{url}/manifest.json: 16777217 bytes, more than the 16777216"):
        local_snapshot(url)
    assert not list((cache / "objects").iterdir())  # refused before a byte came


def test_a_link_in_a_file_url_is_refused(local: Path, tmp_path: Path) -> None:
    shared = shutil.copytree(local, tmp_path / "shared")
    (shared / "blobs" / "elsewhere.safetensors").symlink_to("/etc/hostname")
    with pytest.raises(SnapshotError, match="blobs/elsewhere.safetensors: a link"):
        local_snapshot(shared.as_uri())


def test_a_url_without_fsspec_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("fsspec", "fsspec.core"):
        monkeypatch.setitem(sys.modules, module, None)  # an import of it fails
    result = replay_cli("show", "s3://bucket/snap")
    assert result.exit_code == 2 and "pip install kernel-replay[fsspec]" in result.stderr, result.output


def test_upload_lands_every_rank_and_refuses_a_taken_url(local: Path, tmp_path: Path) -> None:
    parent = tmp_path / "ranks"
    for rank in range(2):
        shutil.copytree(local, parent / f"rank-{rank}")
    url = uploaded(parent, memory_url())
    view = local_snapshot(url)
    assert all((view / f"rank-{rank}" / "manifest.json").is_file() for rank in range(2))
    for taken in (url, f"{url}/rank-1"):
        with pytest.raises(SnapshotError, match=f"^{taken}: already holds a snapshot"):
            upload_snapshot(local, taken)


def test_upload_leaves_no_temporary_beside_the_files(local: Path, tmp_path: Path) -> None:
    target = tmp_path / "bucket" / "snap"
    upload_snapshot(local, target.as_uri())
    landed = sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())
    assert landed == sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())


def test_upload_lands_the_index_then_the_manifest_last(local: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed: list[str] = []
    put_file = MemoryFileSystem.put_file

    def logged(fs: MemoryFileSystem, source: str, target: str, **kwargs: object) -> None:
        landed.append(Path(source).relative_to(local).as_posix())
        put_file(fs, source, target, **kwargs)
    monkeypatch.setattr(MemoryFileSystem, "put_file", logged)
    upload_snapshot(local, memory_url())
    assert landed[-2:] == ["calls.jsonl", "manifest.json"] and len(landed) == len(set(landed)) > 2


def in_program_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prog.py makes one call of a captured function in module storage_prog_ops; the directory is the current one."""
    (tmp_path / "storage_prog_ops.py").write_text(
        "import replay\n\n@replay.capture('storage_prog_double')\ndef double(x):\n    return x * 2\n")
    (tmp_path / "prog.py").write_text("import torch\nfrom storage_prog_ops import double\ndouble(torch.arange(4.0))\n")
    monkeypatch.chdir(tmp_path)


def test_record_to_a_url_lands_a_snapshot_that_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    cache: Path) -> None:
    in_program_directory(tmp_path, monkeypatch)
    url = (tmp_path / "bucket" / "recorded").as_uri()
    result = replay_cli("record", "-o", url, "--", sys.executable, "prog.py")
    assert result.exit_code == 0 and f"recorded 1 call into {url}" in result.stderr.replace("\n", ""), result.output
    assert not any((cache / "recordings").iterdir())  # the local recording went once uploaded
    assert replay_cli("run", url, "--provider", "storage_prog_ops").exit_code == 0
    again = replay_cli("record", "-o", url, "--", sys.executable, "prog.py")
    assert again.exit_code == 2 and "already holds a snapshot" in again.stderr
    lost = replay_cli("record", "-o", memory_url(), "--", sys.executable, "prog.py")  # gone with this process
    assert lost.exit_code == 2 and "memory://" in lost.stderr and not any((cache / "recordings").iterdir())


def test_a_failed_upload_keeps_the_recording_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            cache: Path) -> None:
    in_program_directory(tmp_path, monkeypatch)
    monkeypatch.setattr(LocalFileSystem, "put_file",
                        lambda *args, **kwargs: (_ for _ in ()).throw(OSError("the store is down")))
    result = replay_cli("record", "-o", (tmp_path / "bucket" / "down").as_uri(), "--", sys.executable, "prog.py")
    (kept,) = (cache / "recordings").iterdir()
    assert result.exit_code == 2 and "the store is down" in result.stderr and str(kept) in result.stderr
    assert (kept / "manifest.json").is_file()
