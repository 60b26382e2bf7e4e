"""Multi-rank recordings on CPU: a tiny tensor-parallel MLP (tp_project/mlp.py: up projection split by
columns, down projection by rows, an all_reduce after) run under torchrun over gloo with 2 and 4 ranks,
recorded with `replay record` as a user types it; replayed per rank with its collectives checked
across ranks; a planted rank-dependent bug (one rank never moves its position_buf on) named by
`replay diff --ranks`; the sharded recording put back together against an unsharded one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from replay.ranks.collective_check import CollectiveCheck, _check
from replay.ranks.layout import rank_from_env
from replay.snapshot import CallRecord
from user_shell import fenced, run_as_written, shell

PROJECT = Path(__file__).with_name("tp_project")
NCCL = torch.cuda.device_count() >= 2  # tp_project's programs take NCCL with a GPU a rank, else gloo on the CPU
pytestmark = pytest.mark.skipif(torch.cuda.device_count() == 1,
                                reason="tp_project's programs take a GPU a rank or none: one GPU is neither")


def on(world: int) -> str:
    """Replay where the ranks ran: on the GPUs with one a rank, else in the interpreter on the CPU."""
    return "" if torch.cuda.device_count() >= world else "--device cpu"


ON = on(2)
ADD, MATMUL = "tplib.kernels.add_position_kernel", "tplib.kernels.matmul_kernel"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("tp") / "tp_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def record(project: Path, name: str, command: str, env: str = "") -> Path:
    done = shell(f"{env} replay record -o snapshots/{name} -- {command}", project)
    assert done.returncode == 0, done.stderr
    return project / "snapshots" / name


@pytest.fixture(scope="module")
def clean(project: Path) -> Path:
    return record(project, "tp2", "torchrun --nproc-per-node 2 mlp.py")


@pytest.fixture(scope="module")
def unsharded(project: Path) -> Path:
    return record(project, "single", "python mlp.py")


def replay_json(project: Path, line: str) -> tuple[int, dict]:
    done = shell(f"replay {line} --json -", project)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_each_rank_records_a_snapshot_of_its_own_with_the_run_it_belongs_to(clean: Path, project: Path) -> None:
    assert sorted(p.name for p in clean.iterdir()) == ["rank-0", "rank-1"]
    manifests = [json.loads((clean / f"rank-{r}" / "manifest.json").read_text())["distributed"] for r in (0, 1)]
    assert [m["rank"] for m in manifests] == [0, 1] and {m["world_size"] for m in manifests} == {2}
    assert manifests[0]["run_id"] == manifests[1]["run_id"] and len(manifests[0]["run_id"]) == 32
    backend = "nccl" if NCCL else "gloo"
    assert manifests[0]["backend"] == backend and manifests[0]["groups"] == [{"ranks": [0, 1], "backend": backend}]
    code, shown = replay_json(project, f"show {clean}")
    assert code == 0 and shown["world_size"] == 2
    ops = [call["op"] for call in shown["ranks"]["1"]["calls"]]
    assert ops == [ADD, "tplib.kernels.matmul_relu_kernel", MATMUL, "torch.distributed.all_reduce"] * 3
    reduce = shown["ranks"]["1"]["calls"][3]
    assert [t["role"] + "/" + t["name"] for t in reduce["tensors"]] == ["in/tensor", "out/tensor"]


def test_replay_run_replays_each_rank_and_checks_collectives_across_ranks(clean: Path, project: Path) -> None:
    code, report = replay_json(project, f"run {clean} --code . {ON}")
    assert code == 0, report
    assert [report["ranks"][r]["calls_checked"] for r in ("0", "1")] == [9, 9]  # kernels; the all_reduces apart
    assert report["collectives_checked"] == 3 and report["collectives_failed"] == 0
    alone = shell(f"replay run {clean}/rank-1 --code . {ON}", project)
    assert alone.returncode == 0 and "3 collective call(s)" in alone.stderr, alone.stderr


def test_replay_run_on_ray_gives_the_local_verdicts(clean: Path, project: Path) -> None:
    pytest.importorskip("ray")
    code, report = replay_json(project, f"run {clean} --code . {ON} --executor ray --jobs 2")  # a local Ray
    assert code == 0, report
    assert [report["ranks"][r]["calls_checked"] for r in ("0", "1")] == [9, 9] and report["collectives_checked"] == 3


def test_diff_ranks_passes_on_a_clean_recording(clean: Path, project: Path) -> None:
    code, report = replay_json(project, f"diff --ranks {clean}")
    assert code == 0 and report["agree"] and report["calls_compared"] == 12


@pytest.mark.parametrize("world", [2, 4])
def test_diff_ranks_names_the_rank_whose_position_buf_went_stale(project: Path, world: int) -> None:
    if 0 < torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} GPUs for NCCL, or none (gloo in the interpreter)")
    stale = record(project, f"stale{world}", f"torchrun --nproc-per-node {world} mlp.py", env="TP_STALE_RANK=1")
    code, report = replay_json(project, f"diff --ranks {stale}")
    assert code == 1
    first = report["first_divergence"]
    assert first["op"] == ADD and first["ordinal"] == 0 and first["tensor"] == "state/position_buf"
    assert first["differing_ranks"] == [1] and first["why"] == "runtime state"
    assert first["majority"] == (world > 2)  # two ranks: rank 0 is the reference, and the report says so
    assert first["comparison"]["bad_rows"] == [1, 2, 3]  # position 0 is 0 on both
    code, run = replay_json(project, f"run {stale} --code . {on(world)}")
    assert code == 0, run  # each rank's kernels are right about what they were given: the inputs differ


def test_sharded_recording_put_together_matches_the_unsharded_one(clean: Path, unsharded: Path, project: Path) -> None:
    tolerance = "--atol 1e-5 --rtol 1e-4"  # the down projection's sum is split over ranks
    code, report = replay_json(project, f"diff {clean} {unsharded} --shard matmul_kernel:c_ptr=partial {tolerance}")
    assert code == 0 and report["identical"] and report["calls_compared"] == 9, report
    code, report = replay_json(project, f"diff {clean} {unsharded} {tolerance}")
    assert code == 1 and report["first_divergence"]["tensor"] == "out/c_ptr"
    assert report["first_divergence"]["problem"].startswith("not compared")
    code, report = replay_json(project, f"diff {clean} {unsharded} --shard matmul_kernel:c_ptr=shard:0 {tolerance}")
    assert code == 1 and report["first_divergence"]["op"] == MATMUL  # the wrong placement: shapes differ


def test_collectives_of_subgroups_are_checked_and_compared_within_their_group(project: Path) -> None:
    if 0 < torch.cuda.device_count() < 4:
        pytest.skip("4 ranks need 4 GPUs for NCCL, or none (gloo in the interpreter)")
    recorded = record(project, "subgroups", "torchrun --nproc-per-node 4 subgroups.py")
    code, report = replay_json(project, f"run {recorded} {on(4)}")
    assert code == 0 and [c["group"] for c in report["collectives"]] == [[0, 1], [2, 3], [0, 1, 2, 3]], report
    code, agreement = replay_json(project, f"diff --ranks {recorded}")  # [0, 1] hold 1, [2, 3] hold 5: both right
    assert code == 0 and agreement["agree"], agreement


def test_every_kind_of_collective_is_recorded_and_checked(project: Path) -> None:
    recorded = record(project, "collectives", "torchrun --nproc-per-node 2 collectives.py")
    code, report = replay_json(project, f"run {recorded} {ON}")
    assert code == 0, report
    kinds = [c["kind"] for c in report["collectives"]]
    scattered = ["reduce_scatter"] if NCCL else []  # gloo has none
    assert kinds == ["all_reduce", "all_reduce", "broadcast", "all_gather", "all_gather", *scattered, "all_reduce"]
    assert all(c["passed"] and c["untested"] is None for c in report["collectives"])


def _member(rank: int, kind: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor],
            **header: object) -> CallRecord:
    tensors = {**{f"in/{k}": v for k, v in inputs.items()}, **{f"out/{k}": v for k, v in outputs.items()}}
    return CallRecord(rank, f"torch.distributed.{kind}", "collective", None, [], tensors,
                      collective={"kind": kind, "group": [0, 1, 2], "rank": rank, **header})


def _checked(kind: str, members: dict[int, CallRecord]) -> CollectiveCheck:
    check = CollectiveCheck(kind, 0, (0, 1, 2), {r: 0 for r in members})
    _check(check, members)
    return check


def test_a_collective_result_a_rank_does_not_hold_is_named_with_the_rank() -> None:
    x = [torch.tensor([[1.0, 2.0]]) * (r + 1) for r in range(3)]
    total = sum(x)
    summed = {r: _member(r, "all_reduce", {"tensor": x[r]}, {"tensor": total}, reduce_op="sum") for r in range(3)}
    assert _checked("all_reduce", summed).passed
    summed[1] = _member(1, "all_reduce", {"tensor": x[1]}, {"tensor": total - x[0]}, reduce_op="sum")  # lost rank 0's
    failures = _checked("all_reduce", summed).failures
    assert [f["rank"] for f in failures] == [1] and failures[0]["tensor"] == "out/tensor"
    biggest = {r: _member(r, "all_reduce", {"tensor": x[r]}, {"tensor": x[2]}, reduce_op="max") for r in range(3)}
    assert _checked("all_reduce", biggest).passed
    gathered = {r: _member(r, "all_gather", {"input": x[r], "output": torch.zeros(3, 2)}, {"output": torch.cat(x)},
                           dim=0) for r in range(3)}
    assert _checked("all_gather", gathered).passed
    listed = {r: _member(r, "all_gather", {"input": x[r]}, {f"output_{i}": x[i] for i in range(3)}) for r in range(3)}
    assert _checked("all_gather", listed).passed
    whole = torch.arange(6.0).reshape(3, 2)
    scattered = {r: _member(r, "reduce_scatter", {"input": whole, "output": torch.empty(1, 2)},  # its buffer before
                            {"output": 3 * whole[r:r + 1]}, reduce_op="sum", dim=0) for r in range(3)}
    assert _checked("reduce_scatter", scattered).passed
    sent = {r: _member(r, "broadcast", {"tensor": x[r]}, {"tensor": x[2]}, src=2) for r in range(3)}
    assert _checked("broadcast", sent).passed
    sent[0] = _member(0, "broadcast", {"tensor": x[0]}, {"tensor": x[0]}, src=2)  # kept its own
    assert [f["rank"] for f in _checked("broadcast", sent).failures] == [0]


def _summed_in_bf16(parts: list[torch.Tensor], order: list[int]) -> torch.Tensor:
    """What a backend's ring or tree gives: each partial sum rounded to bfloat16."""
    total = parts[order[0]]
    for r in order[1:]:
        total = (total.float() + parts[r].float()).to(torch.bfloat16)
    return total


def test_a_bf16_sum_of_four_ranks_in_any_order_passes_and_a_wrong_element_does_not() -> None:
    generator = torch.Generator().manual_seed(0)
    parts = [(torch.randn(8, 256, generator=generator) * 10).to(torch.bfloat16) for _ in range(3)]
    parts.append((-(parts[0].float() + parts[1].float() + parts[2].float()) * 0.999).to(torch.bfloat16))  # cancels
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        total = _summed_in_bf16(parts, order)
        members = {r: _member(r, "all_reduce", {"tensor": parts[r]}, {"tensor": total}, reduce_op="sum")
                   for r in range(4)}
        assert _checked("all_reduce", members).passed, order
    wrong = total.clone()
    wrong[5, 7] += 8  # past what any order of summing these could round to
    members[2] = _member(2, "all_reduce", {"tensor": parts[2]}, {"tensor": wrong}, reduce_op="sum")
    failures = _checked("all_reduce", members).failures
    assert [f["rank"] for f in failures] == [2] and failures[0]["comparison"]["mismatches"] == 1
    assert failures[0]["comparison"]["first_index"] == [5, 7]


def test_stacked_outputs_are_checked_and_an_unrecorded_factor_is_said_not_failed() -> None:
    x = [torch.tensor([[1.0, 2.0]]) * (r + 1) for r in range(3)]
    stacked = {r: _member(r, "all_gather", {"input": x[r]}, {"output": torch.stack(x)}, dim=0) for r in range(3)}
    assert _checked("all_gather", stacked).passed  # NCCL's [world, *shape] form of all_gather_into_tensor
    scaled = {r: _member(r, "all_reduce", {"tensor": x[r]}, {"tensor": x[r] * 7}, reduce_op="premul_sum")
              for r in range(3)}
    check = _checked("all_reduce", scaled)
    assert check.passed and check.uncheckable is not None and "scale factor" in check.uncheckable


def test_rank_from_env_is_torchruns_rank_and_nothing_for_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"}
    monkeypatch.delenv("REPLAY_RUN_ID", raising=False)
    info = rank_from_env(env)
    assert info is not None and (info.rank, info.world_size, info.local_rank, info.run_id) == (3, 4, 1, "abc")
    monkeypatch.setenv("REPLAY_RUN_ID", "mine")
    assert rank_from_env(env).run_id == "mine"  # type: ignore[union-attr]
    assert rank_from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None and rank_from_env({}) is None
    assert rank_from_env({"RANK": "4", "WORLD_SIZE": "4"}) is None


def test_bad_multi_rank_input_is_one_line_and_exit_2(clean: Path, unsharded: Path, tmp_path: Path,
                                                     project: Path) -> None:
    again = shell("replay record -o snapshots/tp2 -- torchrun --nproc-per-node 2 mlp.py", project)
    assert again.returncode == 2 and "already holds a snapshot" in again.stderr and "rank 0:" not in again.stdout
    (project / "a-file").write_text("")
    into_file = shell("replay record -o a-file -- python mlp.py", project)
    assert into_file.returncode == 2 and "a file, not a snapshot directory" in into_file.stderr
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "rank-0").symlink_to(clean / "rank-0")  # a link is read as no rank
    done = shell(f"replay run {linked} --code .", project)
    assert done.returncode == 2 and "missing manifest (not a snapshot" in done.stderr, done.stderr
    graph = shell(f"replay graph {clean}", project)  # a command of one snapshot says which to give it
    assert graph.returncode == 2 and f"reads one rank's snapshot: {clean}/rank-0" in graph.stderr
    metric = shell(f"replay diff --ranks {clean} --metric nmse:1e-6", project)
    assert metric.returncode == 2 and "--ranks" in metric.stderr
    code, report = replay_json(project, f"diff {clean} {unsharded} --shard matmul_kernel:c_ptr=shard:7")
    assert code == 1 and "shard:7: the pieces have 2 dimension(s)" in report["first_divergence"]["problem"]


def test_ranks_that_disagree_in_number_are_said(clean: Path, tmp_path: Path, project: Path) -> None:
    more = tmp_path / "more"
    shutil.copytree(clean, more)
    shutil.copytree(clean / "rank-1", more / "rank-2")  # its manifest says rank 1: refused
    done = shell(f"replay diff {clean} {more}", project)
    assert done.returncode == 2 and "says rank 1" in done.stderr
    fewer = tmp_path / "fewer"
    shutil.copytree(clean, fewer)
    index = fewer / "rank-1" / "calls.jsonl"
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:-1]))  # its last all_reduce gone
    code, report = replay_json(project, f"run {fewer} --code . {ON}")
    first = report["first_divergence"]
    assert code == 1 and first["rank"] == 1 and "made no all_reduce 2" in first["description"], report


def test_a_parent_mixing_runs_or_missing_a_rank_is_said(clean: Path, tmp_path: Path, project: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(clean, mixed)
    manifest = mixed / "rank-1" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["distributed"]["run_id"] = "another"
    manifest.write_text(json.dumps(data))
    done = shell(f"replay run {mixed} --code . {ON}", project)
    assert done.returncode == 2 and "different runs" in done.stderr
    shutil.rmtree(mixed / "rank-1")
    code, report = replay_json(project, f"run {mixed} --code . {ON}")
    assert code == 2 and "rank(s) 1 of 2 recorded nothing" in report["problems"][0]


@pytest.mark.slow
def test_the_readme_ranks_section_runs_as_written(tmp_path: Path) -> None:
    if 0 < torch.cuda.device_count() < 2:
        pytest.skip("two ranks need two GPUs for NCCL, or none (gloo in the interpreter)")
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("## Past one GPU")
    lines = [line for line in fenced(text[start:text.index("\n## ", start + 1)], "bash")[0].splitlines() if line]
    project = tmp_path / "tp_project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    run_as_written(lines, [("replay record -o snapshots/tp ", 0, "recorded 24 calls"),
                           ("replay run snapshots/tp --code .", 0, "all ranks passed: 18 calls, 3 collectives"),
                           ("TP_STALE_RANK=1 replay record", 0, "recorded 24 calls"),
                           ("replay diff --ranks snapshots/tp_stale", 1, "first divergence: rank 1, call 0"),
                           ("replay record -o snapshots/single", 0, "recorded 9 calls"),
                           ("replay diff snapshots/tp snapshots/single --shard", 0, "identical: 9 calls")],
                   project)


@pytest.mark.slow
def test_bisect_of_a_multi_rank_recording_made_at_the_bad_commit_finds_the_planted_commit(tmp_path: Path) -> None:
    if 0 < torch.cuda.device_count() < 2:
        pytest.skip("two ranks need two GPUs for NCCL, or none (gloo in the interpreter)")
    repo = tmp_path / "tp_project"
    shutil.copytree(PROJECT, repo, ignore=shutil.ignore_patterns("__pycache__"))
    git = "git -c user.name=t -c user.email=t@t"
    kernels = repo / "tplib" / "kernels.py"
    assert shell(f"git init -q && {git} add -A && {git} commit -qm 'tiny TP MLP' && git tag v1", repo).returncode == 0
    kernels.write_text(kernels.read_text().replace("tl.maximum(acc, 0.0)", "tl.maximum(acc, 0.01)"))  # the bug
    assert shell(f"{git} commit -qam 'relu: a small floor'", repo).returncode == 0
    planted = shell("git rev-parse HEAD", repo).stdout.strip()
    (repo / "NOTES.md").write_text("notes\n")
    assert shell(f"{git} add -A && {git} commit -qm notes", repo).returncode == 0
    recorded = record(repo, "tp", "torchrun --nproc-per-node 2 mlp.py")  # at the bad end, where it was seen
    code, result = replay_json(repo, f"bisect --good v1 --bad HEAD {recorded}")
    assert code == 0 and result["first_bad"]["sha"] == planted and result["oracle"] == "good-end", result
    first = result["first_bad_probe"]["report"]["first_divergence"]
    assert first["op"] == "tplib.kernels.matmul_relu_kernel" and first["rank"] == 0
