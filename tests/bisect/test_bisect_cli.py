"""`replay bisect` on the command line: bad input is one line and exit 2; --json and --log."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bisect_helpers import CHECK
from replay.bisect import SyntheticCommit, write_history
from replay.cli import main


def invoke(*args: str):
    return CliRunner().invoke(main, ["bisect", *args], catch_exceptions=False)


def assert_one_line_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error: "), result.stderr
    for word in words:
        assert word in lines[0]


@pytest.fixture
def history(make_linear):
    return make_linear(20, bug_at=8)


def test_json_output_names_the_first_bad_commit_and_every_probe(history):
    result = invoke("--good", history.shas[0], "--bad", "HEAD", "--repo", str(history.path), "--run", CHECK,
                    "--json", "-")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "found"
    assert answer["first_bad"]["sha"] == history.shas[8]
    assert answer["first_bad"]["subject"] == "commit 8"
    assert answer["parent_probe"]["sha"] == history.shas[7] and answer["parent_probe"]["verdict"] == "good"
    assert answer["probes_run"] == len(answer["probes"]) == answer["search_probes"] + 2


def test_text_output_and_log_file(history, tmp_path):
    log = tmp_path / "bisect.log"
    result = invoke("--good", history.shas[0], "--bad", "HEAD", "--repo", str(history.path), "--run", CHECK,
                    "--log", str(log))
    assert result.exit_code == 0
    assert f"First bad commit {history.shas[8]}" in result.stdout
    assert "commit 8" in result.stdout and "BUG (+1 -0)" in result.stdout
    text = log.read_text()
    assert text.count(" probing ") == text.count(" result ") >= 4
    assert f"first bad commit {history.shas[8][:10]}" in text


def test_a_ref_that_does_not_exist(history):
    assert_one_line_error(invoke("--good", "v9.9", "--bad", "HEAD", "--repo", str(history.path), "--run", CHECK),
                          "--good v9.9", "no such commit")


def test_good_not_an_ancestor_of_bad(tmp_path):
    shas = write_history(tmp_path / "repo", [SyntheticCommit("root"), SyntheticCommit("a", {"a": "1"}),
                                             SyntheticCommit("b", {"b": "1"}, parents=[0])])
    assert_one_line_error(invoke("--good", shas[1], "--bad", shas[2], "--repo", str(tmp_path / "repo"),
                                 "--run", CHECK), "not an ancestor")


def test_good_and_bad_the_same_commit(history):
    assert_one_line_error(invoke("--good", "HEAD", "--bad", history.shas[-1], "--repo", str(history.path),
                                 "--run", CHECK), "same commit")


def test_a_snapshot_that_does_not_exist(history, tmp_path):
    assert_one_line_error(invoke("--good", history.shas[0], "--bad", "HEAD", "--repo", str(history.path),
                                 str(tmp_path / "nowhere")), "snapshot not found")


def test_a_directory_that_is_not_git(tmp_path):
    assert_one_line_error(invoke("--good", "a", "--bad", "b", "--repo", str(tmp_path), "--run", CHECK),
                          "not a git repository")


def test_nothing_to_probe_with(history):
    assert_one_line_error(invoke("--good", history.shas[0], "--bad", "HEAD", "--repo", str(history.path)),
                          "SNAPSHOT", "--run")


def test_good_that_is_actually_bad(history):
    assert_one_line_error(invoke("--good", history.shas[9], "--bad", "HEAD", "--repo", str(history.path),
                                 "--run", CHECK), "is actually bad")


def test_bad_that_is_actually_good(history):
    assert_one_line_error(invoke("--good", history.shas[0], "--bad", history.shas[5], "--repo", str(history.path),
                                 "--run", CHECK), "is actually good")


def test_a_snapshot_is_resolved_once_and_its_digest_keys_the_cache(history, tmp_path, monkeypatch):
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    (snapshot / "manifest.json").write_text('{"format_version": 1}')
    (snapshot / "calls.jsonl").write_text('{"index": 0}\n')
    # a relative SNAPSHOT, read from where it stands now: the probe sees its absolute path
    monkeypatch.chdir(tmp_path)
    probe = f'test "$REPLAY_SNAPSHOT" = "{snapshot}" && {CHECK}'
    args = ["--good", history.shas[0], "--bad", "HEAD", "--repo", str(history.path), "--run", probe, "snap",
            "--json", "-"]
    first = json.loads(invoke(*args).stdout)
    assert first["first_bad"]["sha"] == history.shas[8]
    assert json.loads(invoke(*args).stdout)["probes_run"] == 0
    (snapshot / "calls.jsonl").write_text('{"index": 0}\n{"index": 1}\n')
    assert json.loads(invoke(*args).stdout)["probes_run"] == first["probes_run"]


def test_help_has_examples():
    result = CliRunner().invoke(main, ["bisect", "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output and "--run" in result.output and "--first-parent" in result.output
