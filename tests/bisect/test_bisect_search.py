"""The search strategy alone, on commit graphs with a known culprit: no git, no processes."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.bisect.search import BAD, GOOD, SKIP, BisectSearch, CommitGraph


def chain(n: int) -> CommitGraph:
    return CommitGraph(tuple(f"c{i}" for i in range(n)), tuple((i - 1,) if i else () for i in range(n)))


def ancestors(graph: CommitGraph, i: int) -> set[int]:
    seen, todo = set(), [i]
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo.extend(graph.parents[c])
    return seen


def drive(graph: CommitGraph, culprit: int, k: int, skipped: frozenset[int] = frozenset()):
    """Bisect with a monotone test (bad = has the culprit as ancestor); return (search, rounds, probes)."""
    search, rounds, probes = BisectSearch(graph), 0, 0
    while batch := search.next_batch(k):
        assert len(batch) <= k and len(set(batch)) == len(batch)
        rounds, probes = rounds + 1, probes + len(batch)
        for i in batch:
            assert i not in search.verdicts, "a commit was probed twice"
            verdict = SKIP if i in skipped else BAD if culprit in ancestors(graph, i) else GOOD
            search.record(i, verdict)
    return search, rounds, probes


def test_200_commits_take_at_most_ceil_log2_probes_and_the_worst_case_takes_exactly_that():
    counts = []
    for culprit in range(200):
        search, rounds, probes = drive(chain(200), culprit, k=1)
        assert search.outcome().first_bad == culprit
        counts.append(probes)
    assert max(counts) == math.ceil(math.log2(200)) == 8
    # 256 - 200 = 56 leaves of a balanced binary tree sit one level higher
    assert counts.count(7) == 56


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("n", [2, 5, 37, 200])
def test_k_probes_per_round_need_ceil_log_k_plus_1_rounds(n: int, k: int):
    worst = max(drive(chain(n), culprit, k)[1] for culprit in range(n))
    assert worst == math.ceil(round(math.log(n, k + 1), 9))


@st.composite
def dags(draw):
    """A random history with merges whose last commit descends from all others."""
    n = draw(st.integers(2, 40))
    parents = [()]
    for i in range(1, n):
        first = draw(st.integers(max(0, i - 3), i - 1))
        extra = draw(st.lists(st.integers(0, i - 1), max_size=2))
        parents.append(tuple(dict.fromkeys([first, *extra])))
    graph = CommitGraph(tuple(map(str, range(n))), tuple(parents))
    keep = sorted(ancestors(graph, n - 1))
    index = {old: new for new, old in enumerate(keep)}
    return CommitGraph(tuple(map(str, keep)), tuple(tuple(index[p] for p in graph.parents[c]) for c in keep))


@settings(max_examples=150, deadline=None)
@given(graph=dags(), data=st.data())
def test_on_merge_histories_the_culprit_is_found(graph: CommitGraph, data):
    culprit = data.draw(st.integers(0, len(graph) - 1))
    k = data.draw(st.integers(1, 3))
    search, _, _ = drive(graph, culprit, k)
    assert search.outcome().first_bad == culprit


@settings(max_examples=150, deadline=None)
@given(graph=dags(), data=st.data())
def test_skips_leave_the_culprit_among_the_candidates(graph: CommitGraph, data):
    n = len(graph)
    culprit = data.draw(st.integers(0, n - 1))
    skipped = frozenset(data.draw(st.sets(st.integers(0, n - 2))))
    search, _, _ = drive(graph, culprit, data.draw(st.integers(1, 3)), skipped)
    outcome = search.outcome()
    assert culprit in outcome.candidates
    if outcome.first_bad is None:
        verdicts = [search.verdicts[c] for c in outcome.candidates]
        assert verdicts.count(BAD) == 1 and verdicts.count(SKIP) == len(verdicts) - 1
    else:
        assert outcome.first_bad == culprit


def test_a_skipped_commit_is_stepped_around_and_named_when_it_hides_the_answer():
    # culprit 5 skipped: its neighbours get probed and the answer is "4..5 or 5"
    search, _, _ = drive(chain(10), culprit=5, k=1, skipped=frozenset({5}))
    assert search.outcome().first_bad is None
    assert search.outcome().candidates == (5, 6)
    assert search.verdicts[4] == GOOD and search.verdicts[6] == BAD


def test_a_good_commit_after_a_bad_one_is_a_contradiction_and_the_answer_is_still_a_bad_after_a_good():
    search = BisectSearch(chain(6))
    search.record(2, BAD)
    search.record(4, GOOD)
    assert search.contradictions() == [(4, 2)]
    assert search.next_batch(1) == []
    assert search.outcome().first_bad == 5  # 4 good -> 5 bad is the narrowest transition known
