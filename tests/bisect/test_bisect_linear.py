"""Bisecting linear histories with `--run` probes: the answer, the probe counts, the report."""
from __future__ import annotations

import math

import pytest

from bisect_helpers import git, git_bisect_run


def test_finds_the_commit_that_planted_the_bug_with_its_description_and_parent(make_linear):
    history = make_linear(30, bug_at=17)
    result = history.bisect()
    assert result.first_bad.sha == history.shas[17]
    assert result.first_bad.subject == "commit 17"
    assert ("BUG", 1, 0) in result.first_bad.files
    assert result.first_bad_probe.outcome.verdict == "bad"
    assert result.parent_probe.sha == history.shas[16] and result.parent_probe.outcome.verdict == "good"
    assert result.candidates == [result.first_bad]


def test_200_commits_take_ceil_log2_200_search_probes_in_the_worst_case(make_linear):
    # the bug in the last commit: every probe says good, so each keeps the larger half
    history = make_linear(200, bug_at=200)
    result = history.bisect()
    assert result.first_bad.sha == history.shas[200]
    assert result.probes_run_for("search") == result.rounds == math.ceil(math.log2(200)) == 8
    assert result.probes_run_for("endpoint") == 2
    assert result.range_size == 200


def test_three_jobs_take_fewer_rounds_than_one(make_linear):
    history = make_linear(200, bug_at=200)
    one, three = history.bisect(), history.bisect(jobs=3, reuse_cache=False)
    assert three.first_bad == one.first_bad
    assert three.rounds == math.ceil(math.log(200, 4)) == 4 < one.rounds
    search_rounds = {p.round for p in three.probes if p.purpose == "search"}
    assert all(sum(p.round == r for p in three.probes) <= 3 for r in search_rounds)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_agrees_with_git_bisect_run(make_linear, tmp_path, seed):
    n = 40 + 17 * seed
    bug_at = (seed * 7919) % n + 1
    history = make_linear(n, bug_at=bug_at)
    result = history.bisect(jobs=seed)
    assert result.first_bad.sha == git_bisect_run(history.path, history.shas[0], "HEAD", "test ! -f BUG", tmp_path)
    assert result.first_bad.sha == history.shas[bug_at]


def test_a_rerun_answers_from_the_cache_with_no_probes(make_linear):
    history = make_linear(60, bug_at=23)
    first = history.bisect()
    again = history.bisect()
    assert again.first_bad == first.first_bad
    assert again.probes_run == 0
    assert again.first_bad_probe.cached and again.parent_probe.cached
    assert (history.path / ".git" / "replay-bisect-cache.json").is_file()
    assert history.bisect(reuse_cache=False).probes_run == first.probes_run


def test_a_wider_range_does_not_retest_commits(make_linear):
    history = make_linear(120, bug_at=100)
    narrow = history.bisect(good=history.shas[60])
    wide = history.bisect(good=history.shas[0])
    assert wide.first_bad == narrow.first_bad
    tested_before = {p.sha for p in narrow.probes if not p.cached}
    tested_now = {p.sha for p in wide.probes if not p.cached}
    assert tested_now and not tested_now & tested_before


def test_the_cache_is_per_command(make_linear):
    history = make_linear(20, bug_at=5)
    history.bisect()
    assert history.bisect(run="test ! -e BUG").probes_run > 0


def test_a_probe_printing_json_has_it_captured_as_its_report(make_linear):
    history = make_linear(12, bug_at=6)
    probe = ('if test -f BUG; then echo \'{"passed": false, "first_divergence": {"call": 3}}\'; exit 1; '
             'else echo \'{"passed": true}\'; fi')
    result = history.bisect(run=probe)
    assert result.first_bad_probe.outcome.report == {"passed": False, "first_divergence": {"call": 3}}
    assert result.parent_probe.outcome.report == {"passed": True}


def test_each_parallel_probe_gets_its_own_gpu(make_linear, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    history = make_linear(40, bug_at=11)
    result = history.bisect(run='echo "gpu $CUDA_VISIBLE_DEVICES"; test ! -f BUG', jobs=2)
    run = [p for p in result.probes if not p.cached]
    assert {p.device for p in run} == {"4", "5"}
    assert all(p.outcome.output_tail == f"gpu {p.device}" for p in run)
    rounds = {p.round for p in run if p.purpose == "search"}
    assert all(sorted(p.device for p in run if p.round == r) in (["4"], ["4", "5"]) for r in rounds)


def test_the_probe_runs_in_a_checkout_of_each_commit_not_the_users_tree(make_linear):
    history = make_linear(16, bug_at=9)
    (history.path / "BUG").write_text("the user's own uncommitted BUG file\n")
    git(history.path, "rm", "-q", "--cached", "counter")
    result = history.bisect(run='test "$(git rev-parse HEAD)" = "$REPLAY_BISECT_COMMIT" && test ! -f BUG')
    assert result.first_bad.sha == history.shas[9]
