"""Histories with a merged feature branch that planted the bug."""
from __future__ import annotations

import pytest

from bisect_helpers import History, git_bisect_run
from replay.bisect import SyntheticCommit as C
from replay.bisect import write_history


def merged_feature(path) -> tuple[History, int, int]:
    """root, 10 main commits, a branch of 8 (the 5th plants BUG) merged, 10 more on main.

    Returns the history, the index of the planting commit and of the merge.
    """
    commits = [C("root", {"counter": "0"})]
    commits += [C(f"main {i}", {"counter": str(i)}) for i in range(1, 11)]
    fork = 3
    for i in range(1, 9):
        files = {"feature": str(i), **({"BUG": "x"} if i == 5 else {})}
        commits.append(C(f"feature {i}", files, parents=[fork] if i == 1 else None))
    planted = len(commits) - 4
    commits.append(C("merge feature", {"feature": "8", "BUG": "x"}, parents=[10, len(commits) - 1]))
    merge = len(commits) - 1
    commits += [C(f"main {i}", {"counter": str(i)}) for i in range(11, 21)]
    return History(path, write_history(path, commits)), planted, merge


@pytest.mark.parametrize("first_parent", [True, False])
def test_merges_bisect_to_the_merge_with_first_parent_and_into_the_branch_without(tmp_path, first_parent):
    history, planted, merge = merged_feature(tmp_path / "repo")
    result = history.bisect(first_parent=first_parent)
    expected = history.shas[merge if first_parent else planted]
    assert result.first_bad.sha == expected
    assert git_bisect_run(history.path, history.shas[0], "HEAD", "test ! -f BUG", tmp_path, first_parent) == expected
    assert result.parent_probe.outcome.verdict == "good"
    if first_parent:
        assert result.range_size == 20 + 1  # main 1..20 and the merge, no feature commits
