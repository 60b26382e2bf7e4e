"""Recording where it cannot or must not: two recorders on one directory, a file, a read-only place."""
from __future__ import annotations

import errno
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import replay
from replay import recorder
from replay.errors import ReplayError, SnapshotError
from replay.snapshot import Snapshot, files, writer

RIVALS = 8
CALLS = 3


@replay.capture("hostile_add")
def add(x: torch.Tensor, who: int) -> torch.Tensor:
    return x + who


def assert_holds_only_calls_of(path: Path, who: int) -> None:
    """The snapshot reads back, every call loads, and all of them are `who`'s."""
    snapshot = Snapshot(path)
    assert [e.index for e in snapshot.entries] == list(range(CALLS))
    for record in snapshot:
        assert record.arguments()["who"] == who
        assert torch.equal(record.tensors["out/out"], torch.full((2,), float(who)))


def race(attempt, rivals: int = RIVALS) -> tuple[list[int], list[BaseException]]:
    """Run attempt(who) on `rivals` threads released at once; who succeeded, what the others raised."""
    start = threading.Barrier(rivals)
    won: list[int] = []
    refused: list[BaseException] = []

    def rival(who: int) -> None:
        start.wait()
        try:
            attempt(who)
        except BaseException as exc:  # noqa: BLE001 -- collected, checked by the test
            refused.append(exc)
        else:
            won.append(who)

    threads = [threading.Thread(target=rival, args=(who,)) for who in range(1, rivals + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_recorders_on_threads_one_directory_exactly_one_records(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    spec, fn = add.__replay_spec__, add.__wrapped__

    def attempt(who: int) -> None:
        rec = recorder.Recording(path)  # each its own recording: only the directory is shared
        for _ in range(CALLS):
            rec.record(spec, fn, inspect.signature(fn), (torch.zeros(2), who), {})
        rec.close()  # its writer thread has written every call

    won, refused = race(attempt)
    assert len(won) == 1, refused
    assert len(refused) == RIVALS - 1
    for exc in refused:
        assert isinstance(exc, SnapshotError)
        assert str(exc) == f"{path}: already holds a snapshot; record into a new directory"
    assert_holds_only_calls_of(path, won[0])
    assert not list(path.glob(".manifest.json.*"))  # no temporary left behind


def test_recordings_started_on_threads_exactly_one_records(tmp_path: Path) -> None:
    path = tmp_path / "snap"

    def attempt(who: int) -> None:
        with replay.recording(path):
            for _ in range(CALLS):
                add(torch.zeros(2), who)

    won, refused = race(attempt)
    assert len(won) == 1, refused
    assert len(refused) == RIVALS - 1
    for exc in refused:  # "already active" while it records, "already holds a snapshot" after
        assert isinstance(exc, ReplayError) and str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
    assert recorder.active() is None
    assert_holds_only_calls_of(path, won[0])


RIVAL = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch, replay
    from replay import recorder
    from replay.errors import ReplayError

    who, route, snapshot, gate = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])

    @replay.capture("hostile_add")
    def add(x, who):
        return x + who

    def work():
        for _ in range(3):
            add(torch.zeros(2), who)

    (gate.parent / f"ready{who}").touch()
    while not gate.exists():  # both processes are released at the same moment
        time.sleep(0.0005)
    if route == "env":  # what `import replay` does with REPLAY_CAPTURE set
        os.environ["REPLAY_CAPTURE"] = snapshot
        recorder.start_from_env()
        work()
        print("recorded" if recorder.active() else "not recorded")
    else:
        try:
            with replay.recording(snapshot):
                work()
        except ReplayError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            sys.exit(3)
        print("recorded")
""")


@pytest.mark.parametrize("route", ["env", "api"])
def test_two_processes_recording_into_one_directory_exactly_one_records(route: str, tmp_path: Path) -> None:
    path, gate = tmp_path / "snap", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAY_")}
    rivals = {who: subprocess.Popen([sys.executable, "-c", RIVAL, str(who), route, str(path), str(gate)],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for who in (1, 2)}
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{who}").exists() for who in rivals):
            assert all(p.poll() is None for p in rivals.values()), [p.communicate() for p in rivals.values()]
            assert time.monotonic() < deadline, "the rivals never got ready"
            time.sleep(0.01)
        gate.touch()
        done = {who: (p.wait(timeout=120), *p.communicate()) for who, p in rivals.items()}
    finally:
        for p in rivals.values():
            p.kill()
    winners = [who for who, (_, out, _) in done.items() if out.strip() == "recorded"]
    assert len(winners) == 1, done
    (loser,) = set(done) - set(winners)
    code, out, err = done[loser]
    refusal = f"{path}: already holds a snapshot; record into a new directory"
    if route == "env":  # the program runs on, unrecorded, after one line
        assert (code, out.strip()) == (0, "not recorded"), err
        assert err.splitlines() == [f"replay: capture: {refusal}; not recording"]
    else:
        assert code == 3 and err.splitlines() == [f"refused: {refusal}"]
    assert done[winners[0]][0] == 0, done[winners[0]][2]
    assert_holds_only_calls_of(path, winners[0])


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_recording_into_a_file_is_one_clear_error(where: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    path = tmp_path / "file" if where == "file" else tmp_path / "file" / "snap"
    with pytest.raises(SnapshotError) as raised:
        replay.recording(path).__enter__()
    message = str(raised.value)
    assert message.startswith(f"{path}: cannot record a snapshot here: ")
    assert os.strerror(errno.ENOTDIR) in message and "\n" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert recorder.active() is None
    assert (tmp_path / "file").read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_recording_under_a_read_only_directory_is_one_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(SnapshotError) as raised:
            replay.recording(locked / "snap").__enter__()
    finally:
        locked.chmod(0o755)
    assert str(raised.value) == f"{locked / 'snap'}: cannot record a snapshot here: {os.strerror(errno.EACCES)}"
    assert recorder.active() is None


@pytest.mark.parametrize("leftover", ["calls.jsonl", "calls/000000-op.safetensors", "blobs/0a1b.safetensors"])
def test_calls_of_an_earlier_recording_without_a_manifest_are_refused(leftover: str, tmp_path: Path) -> None:
    path = tmp_path / "snap"
    (path / leftover).parent.mkdir(parents=True, exist_ok=True)
    (path / leftover).write_text("{}\n")
    with pytest.raises(SnapshotError, match=f"holds {leftover.split('/')[0]} of an earlier recording but no "
                                            "manifest.json; record into a new directory"):
        replay.recording(path).__enter__()
    assert not (path / "manifest.json").exists() and recorder.active() is None


def test_other_files_and_leftover_temporaries_do_not_stop_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    (path / "calls").mkdir(parents=True)
    (path / "calls" / ".000000-op.safetensors.1.2.tmp").write_bytes(b"half a file")  # a killed write
    (path / "README").write_text("prefill run")
    with replay.recording(path):
        for _ in range(CALLS):
            add(torch.zeros(2), 5)
    assert_holds_only_calls_of(path, 5)


def test_without_hard_links_the_manifest_is_still_created_exclusively(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(files.os, "link", no_links)
    path = tmp_path / "snap"
    won, refused = race(lambda who: writer.SnapshotWriter(path))
    assert len(won) == 1 and all(isinstance(exc, SnapshotError) for exc in refused), refused
    assert Snapshot(path).manifest["capture_errors"] == []
    assert sorted(p.name for p in path.iterdir()) == ["blobs", "manifest.json", "segments"]


def test_an_unwritable_parent_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self == tmp_path / "parent":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    path = tmp_path / "parent" / "snap"
    with pytest.raises(SnapshotError) as raised:
        replay.recording(path).__enter__()
    assert str(raised.value) == (f"{path}: cannot record a snapshot here: "
                                 f"{os.strerror(errno.EACCES)} ({tmp_path / 'parent'})")
