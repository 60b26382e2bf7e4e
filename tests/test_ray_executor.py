"""`--executor ray`: bisect probes and `replay run`'s calls as Ray tasks, on one local Ray for the module."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

ray = pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent / "bisect"))  # the bisect tests' helpers and toy kernel
from bisect_helpers import History, linear  # noqa: E402
from test_bisect_engine import (INSIDE_TOLERANCE, MODULE, OP, PROVIDER, history, kernels_of,  # noqa: E402
                                record_batched_call)

import replay  # noqa: E402
from replay import demo, registry  # noqa: E402
from replay.bisect import BisectOptions, BisectResult, run_bisect, write_history  # noqa: E402
from replay.bisect.cache import CACHE_NAME, ProbeCache, snapshot_digest  # noqa: E402
from replay.cli import main  # noqa: E402
from replay.engine.fanout import shards  # noqa: E402
from replay.errors import ReplayError  # noqa: E402
from replay.ray_cluster import cancel_all, import_ray  # noqa: E402

WORKERS = 3  # CPUs of the local Ray: more than the machine's 2 cores, so a round of probes never waits for one


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray of its own for the test process (address "local": under xdist each process starts
    its own), started once: a module's fixture starts Ray again each time xdist hands the process this
    module's tests after another's, and Ray started and shut down over and over in one process took a
    CI worker down once. Ray's SIGTERM handler (it exits at once) is not left to the tests after."""
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    signal.signal(signal.SIGTERM, sigterm)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def on_ray(local_ray):
    """Every test here runs with the process's Ray up."""


def search_rounds(result: BisectResult) -> list[set[str]]:
    """The commits each search round probed."""
    return [{p.sha for p in result.probes if p.purpose == "search" and p.round == r}
            for r in range(1, result.rounds + 1)]


@pytest.mark.parametrize("ship, jobs", [("shared", 2), ("ray", 3)])
def test_a_ray_bisect_of_the_demo_history_gives_the_local_pools_answer_in_the_same_rounds(tmp_path, ship, jobs):
    shas = write_history(tmp_path / "repo", demo.kernel_history(demo.kernel_sources()))
    planted = f"! grep -q {demo.BUG_FUNCTION} {demo.BUG_FILE}"  # the planted commit's code, read in its tree
    history = History(tmp_path / "repo", shas)
    on_ray = history.bisect(run=planted, jobs=jobs, executor="ray", ship=ship)
    local = history.bisect(run=planted, jobs=jobs, reuse_cache=False)
    assert on_ray.first_bad.sha == local.first_bad.sha == shas[demo.BUG_AT]
    assert on_ray.rounds == local.rounds and search_rounds(on_ray) == search_rounds(local)
    assert all(len(probed) <= jobs for probed in search_rounds(on_ray))
    assert on_ray.probes_run == local.probes_run


# the demo's commits a probe of its prefill meets: its good import, its refactor, the planted commit with one
# harmless commit either side, and its HEAD (each commit holds its files whole: the others add only notes);
# the whole history's rounds on Ray are the first test's, with a probe that costs nothing
DEMO_KEPT = sorted({0, demo.REFACTOR_AT, demo.BUG_AT - 1, demo.BUG_AT, demo.BUG_AT + 1, demo.HISTORY_LENGTH - 1})


@pytest.mark.slow  # about a minute on 2 CPU cores: `replay run` of the demo's prefill at each probe
def test_the_demo_bisected_on_ray_with_its_snapshot_shipped_finds_the_planted_commit(tmp_path):
    commits = demo.kernel_history(demo.kernel_sources())
    shas = write_history(tmp_path / "repo", [commits[i] for i in DEMO_KEPT])
    planted = shas[DEMO_KEPT.index(demo.BUG_AT)]
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tmp_path / "good"), shas[0]], cwd=tmp_path / "repo",
                   check=True)
    demo.record_snapshot(tmp_path / "good", tmp_path / "prefill")
    subprocess.run(["git", "worktree", "remove", "--force", str(tmp_path / "good")], cwd=tmp_path / "repo", check=True)
    history = History(tmp_path / "repo", shas)
    on_ray = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=tmp_path / "prefill", repo=history.path,
                                      jobs=2, executor="ray", ship="ray"))
    local = history.bisect(run=f"! grep -q {demo.BUG_FUNCTION} {demo.BUG_FILE}", jobs=2)  # the same verdicts, fast
    assert on_ray.first_bad.sha == local.first_bad.sha == planted
    assert search_rounds(on_ray) == search_rounds(local)


def test_replay_bisect_reaches_the_cluster_at_ray_address_and_leaves_it_running(tmp_path):
    history = linear(tmp_path / "repo", 30, bug_at=11)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "-m", "replay", "bisect", "--good", history.shas[0], "--bad", "HEAD",
                           "--repo", str(history.path), "--run", "test ! -f BUG", "--executor", "ray", "--jobs", "2",
                           "--ship", "ray", "--log", str(tmp_path / "log"), "--json", "-"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["first_bad"]["sha"] == history.shas[11]
    assert "probes run as Ray tasks" in (tmp_path / "log").read_text()
    assert ray.is_initialized() and ray.cluster_resources()["CPU"] == WORKERS  # the module's Ray, still there


def first_searched(history: History, jobs: int) -> str:
    """A commit the search probes (the first of its first round), found by a local bisect."""
    local = history.bisect(jobs=jobs)
    return next(p.sha for p in local.probes if p.purpose == "search" and p.round == 1)


@pytest.mark.parametrize("ship", ["shared", "ray"])
def test_a_worker_killed_mid_probe_is_retried_and_the_bisect_finds_the_commit(tmp_path, ship):
    history = linear(tmp_path / "repo", 40, bug_at=23)
    target, marker = first_searched(history, jobs=2), tmp_path / "killed-once"
    # the first attempt at `target` kills its Ray worker (the shell's parent); the retry finds the marker
    probe = (f'if [ "$REPLAY_BISECT_COMMIT" = {target} ] && mkdir {marker} 2>/dev/null; then kill -9 $PPID; exit 3; '
             'fi; test ! -f BUG')
    result = history.bisect(run=probe, jobs=2, executor="ray", ship=ship)
    assert marker.is_dir()  # the worker was killed once
    assert result.first_bad.sha == history.shas[23]
    (retried,) = [p for p in result.probes if p.sha == target]
    assert retried.outcome.verdict in ("good", "bad") and retried.outcome.exit_code in (0, 1)


def test_a_probe_whose_worker_dies_every_time_is_untested_never_good_or_bad_nor_cached(tmp_path):
    history = linear(tmp_path / "repo", 40, bug_at=23)
    target = first_searched(history, jobs=2)
    probe = f'if [ "$REPLAY_BISECT_COMMIT" = {target} ]; then kill -9 $PPID; exit 3; fi; test ! -f BUG'
    result = history.bisect(run=probe, jobs=2, executor="ray")
    (lost,) = [p for p in result.probes if p.sha == target]
    assert lost.outcome.verdict == "skip" and lost.outcome.exit_code is None
    assert lost.outcome.reason.startswith("untested: Ray worker lost (WorkerCrashedError after 2 tries)")
    assert ProbeCache(history.path / ".git" / CACHE_NAME, snapshot_digest(None)).get(target, probe) is None
    assert target != history.shas[23] and result.first_bad.sha == history.shas[23]  # the rest still decides


def test_the_engine_probe_with_the_snapshot_shipped_finds_a_bug_against_the_good_ends_outputs(tmp_path):
    # the good-end oracle: outputs kept by a probe on a worker (--save-outputs) come back, and go out again
    recorded = record_batched_call(PROVIDER.replace("BUG", ""), tmp_path, "snapshot")
    shas = history(tmp_path, bug_at=2, buggy=INSIDE_TOLERANCE)
    result = run_bisect(BisectOptions(good=shas[0], bad="HEAD", snapshot=recorded, repo=tmp_path / "repo",
                                      providers=(MODULE,), jobs=3, executor="ray", ship="ray"))
    assert result.oracle == "good-end" and result.first_bad.sha == shas[2]


ROWS = [2, 3, 2, 3, 6, 2]  # one batched call each; the bug below shows in call 4 only, in the last of 3 shards
WIDE_ROWS_BUG = PROVIDER.replace("BUG", "    if x.shape[0] > 4:\n        out[1:] += 1\n")


@pytest.fixture
def six_calls(tmp_path):
    """A snapshot of six calls of the clean toy kernel, and a folder of code (--code) that breaks call 4."""
    with kernels_of(PROVIDER.replace("BUG", ""), tmp_path / "clean") as kernels, \
            replay.recording(tmp_path / "snapshot"):
        for i, rows in enumerate(ROWS):
            kernels.batched(torch.randn(rows, 8, generator=torch.Generator().manual_seed(i)))
    (tmp_path / "buggy").mkdir()
    (tmp_path / "buggy" / f"{MODULE}.py").write_text(WIDE_ROWS_BUG)
    yield tmp_path / "snapshot", tmp_path / "clean", tmp_path / "buggy"
    sys.modules.pop(MODULE, None)  # the in-process run imported it through --code
    registry._OPS.pop(OP, None)


def replayed(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", *args, "--json", "-"])
    return result.exit_code, json.loads(result.stdout)


def verdicts(report: dict) -> list[tuple[int, bool]]:
    return [(call["index"], call["passed"]) for call in report["calls"]]


@pytest.mark.parametrize("ship", ["shared", "ray"])
def test_replay_run_on_ray_gives_the_local_verdicts_and_the_same_first_call(six_calls, ship):
    snapshot, clean, buggy = six_calls
    for code, exit_code in ((clean, 0), (buggy, 1)):
        here = replayed(str(snapshot), "--code", str(code))
        on_ray = replayed(str(snapshot), "--code", str(code), "--executor", "ray", "--jobs", "3", "--ship", ship)
        assert here[0] == on_ray[0] == exit_code
        assert verdicts(on_ray[1]) == verdicts(here[1]) and len(verdicts(here[1])) == len(ROWS)
    assert here[1]["first_divergence"]["call"] == on_ray[1]["first_divergence"]["call"] == 4


def test_replay_run_refuses_what_cannot_be_split_among_tasks(tmp_path):
    snapshot = Path(__file__).parent.parent / "snapshots" / "prefill_001"
    for extra in (["--save-outputs", str(tmp_path / "out")], ["--propagate"]):
        result = CliRunner().invoke(main, ["run", str(snapshot), "--executor", "ray", *extra])
        assert result.exit_code == 2 and "cannot be combined with --executor ray" in result.stderr
    result = CliRunner().invoke(main, ["run", str(snapshot), "--jobs", "2"])
    assert result.exit_code == 2 and "give --executor ray too" in result.stderr


def test_only_unfinished_tasks_are_cancelled(monkeypatch):
    # Ray 2.60 aborts the driver when a cancel meets a finished task's reply: what finished is left alone
    finished = [ray.remote(lambda: 1).remote() for _ in range(3)]
    ray.get(finished)
    running = ray.remote(lambda: time.sleep(60)).remote()
    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda ref, **_: cancelled.append(ref))
    cancel_all([*finished, running])
    assert cancelled == [running]
    monkeypatch.undo()
    ray.cancel(running, force=True)


def test_shards_are_contiguous_and_even():
    assert shards(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shards([4, 9], 5) == [[4], [9]]


def test_without_ray_installed_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ReplayError, match=r"pip install kernel-replay\[ray\]"):
        import_ray()
