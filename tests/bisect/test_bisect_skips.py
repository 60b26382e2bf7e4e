"""Commits that cannot be tested: exit 125, odd exit codes and timeouts are skipped with the reason kept."""
from __future__ import annotations

import pytest
from bisect_helpers import git_bisect_run

from replay.bisect import BisectError

# A commit with SKIP cannot be built; one with FLAKY crashes oddly; one with HANG never finishes.
PROBE = ("if test -f SKIP; then exit 125; fi; if test -f FLAKY; then exit 3; fi; "
         "if test -f HANG; then sleep 30; fi; test ! -f BUG")


def marks(name: str, first: int, last: int) -> dict[int, dict[str, str | None]]:
    """Commits first..last carry the marker file `name`."""
    return {first: {name: "x"}, last + 1: {name: None}}


def test_untestable_commits_are_stepped_around_like_git_bisect(make_linear, tmp_path):
    # commits 19..21 fail to build, right where the first probe lands
    history = make_linear(40, bug_at=26, extra=marks("SKIP", 19, 21))
    result = history.bisect(run=PROBE)
    assert result.first_bad.sha == history.shas[26]
    skipped = [p for p in result.probes if p.outcome.verdict == "skip"]
    assert skipped and all(p.outcome.reason == "exit 125: cannot be tested" for p in skipped)
    assert result.first_bad.sha == git_bisect_run(history.path, history.shas[0], "HEAD", PROBE, tmp_path)


def test_when_skips_hide_the_answer_the_candidate_range_is_given(make_linear):
    # the bug lands inside a stretch that cannot be built: 10..12 are all suspects with 13
    history = make_linear(30, bug_at=11, extra=marks("SKIP", 10, 12))
    result = history.bisect(run=PROBE)
    assert result.first_bad is None
    assert [c.sha for c in result.candidates] == history.shas[10:14]
    assert result.to_json()["status"] == "ambiguous"


def test_a_flaky_exit_code_is_a_skip_with_its_reason_and_is_not_cached(make_linear):
    history = make_linear(20, bug_at=10, extra=marks("FLAKY", 10, 10))
    result = history.bisect(run=PROBE.replace("test -f SKIP", "false"))
    flaky = next(p for p in result.probes if p.sha == history.shas[10])
    assert flaky.outcome.verdict == "skip"
    assert flaky.outcome.reason == "exit 3: not a verdict (0 good, 1 bad, 125 skip)"
    assert [c.sha for c in result.candidates] == history.shas[10:12]  # 10 or its bad child 11
    again = history.bisect(run=PROBE.replace("test -f SKIP", "false"))
    assert [p.sha for p in again.probes if not p.cached] == [history.shas[10]]


def test_a_probe_past_the_timeout_is_killed_and_skipped(make_linear):
    history = make_linear(20, bug_at=10, extra=marks("HANG", 9, 9))
    result = history.bisect(run=PROBE, timeout=0.5)
    hung = next(p for p in result.probes if p.sha == history.shas[9])
    assert hung.outcome.verdict == "skip" and hung.outcome.reason == "timed out after 0.5 s"
    assert hung.outcome.seconds < 5
    assert [c.sha for c in result.candidates] == history.shas[9:11]


def test_ends_that_cannot_be_tested_say_what_the_probe_said_once(make_linear):
    history = make_linear(6, bug_at=3)
    probe = "echo 'replay: error: snap: call 0: kernel k was generated when recorded' >&2; exit 2"
    with pytest.raises(BisectError) as raised:
        history.bisect(run=probe)
    said = str(raised.value)
    assert said.startswith(f"--good {history.shas[0][:10]} and --bad ")
    assert said.count("the probe said: replay: error: snap: call 0: kernel k was generated when recorded") == 1
