"""Hostile moments: Ctrl-C twice or three times while worktrees are cleaned up, a git killed
half-way through an add or a remove, and a damaged probe cache."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import git as gitpython
import pytest
from click.testing import CliRunner

from bisect_helpers import CHECK, git, leftover_worktrees, repo_state
from replay.bisect import interrupts
from replay.bisect.cache import CACHE_NAME, ProbeCache
from replay.bisect.worktrees import PREFIX, Worktrees
from replay.cli import main



@pytest.fixture
def history(make_linear):
    return make_linear(12, bug_at=5)


@pytest.fixture
def before_git(monkeypatch):
    """{subcommand: fn}: fn(argv) runs before each `git worktree SUBCOMMAND` of this process, and may act
    or raise as a git killed part-way would."""
    hooks = {}
    real = gitpython.Git.execute

    def execute(self, command, *args, **kwargs):
        if isinstance(command, list) and "worktree" in command:
            hook = hooks.get(command[command.index("worktree") + 1])
            if hook is not None:
                hook(command)
        return real(self, command, *args, **kwargs)
    monkeypatch.setattr(gitpython.Git, "execute", execute)
    return hooks


def ctrl_c_at_the_first(times: int):
    """A hook that sends this process SIGINT the first `times` times it runs."""
    sent = []

    def hook(argv: list[str]) -> None:
        if len(sent) < times:
            sent.append(argv[-1])
            os.kill(os.getpid(), signal.SIGINT)
    hook.sent = sent
    return hook


# ---- the interrupt guard -----------------------------------------------------------------------

def test_signals_after_the_first_interrupt_wait_until_the_block_has_cleaned_up():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.interruptible():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # unwinds like Ctrl-C
                time.sleep(5)
            finally:  # a second and third signal, before and during the cleanup, cannot cut it short
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                cleaned.append("done")
    assert cleaned == ["done"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_inside_a_deferred_block_is_raised_once_the_block_is_done():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.interruptible():
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("finished")
            steps.append("not reached")
    assert steps == ["finished"]


# ---- worktrees: every add ends removed, whatever interrupts the removal ------------------------

def test_ctrl_c_during_every_removal_still_removes_every_worktree(history, before_git):
    ctrl_c = before_git["remove"] = ctrl_c_at_the_first(3)
    with pytest.raises(KeyboardInterrupt):
        with Worktrees(gitpython.Repo(history.path)) as worktrees:
            with worktrees.checkout(history.shas[1]), worktrees.checkout(history.shas[2]):
                raise KeyboardInterrupt  # the first Ctrl-C, mid-probe; the hook sends the next ones
    assert len(ctrl_c.sent) >= 2
    assert leftover_worktrees(history.path) == ""
    assert not worktrees.root.exists()


def test_a_git_worktree_remove_killed_half_way_leaves_no_prunable_entry(history, before_git):
    def killed_after_deleting_the_directory(argv: list[str]) -> None:
        shutil.rmtree(argv[-1])  # git deletes the worktree, then its .git/worktrees entry: killed in between
        raise gitpython.GitCommandError(argv, -signal.SIGINT)
    before_git["remove"] = killed_after_deleting_the_directory
    with Worktrees(gitpython.Repo(history.path)) as worktrees:
        with worktrees.checkout(history.shas[3]) as path:
            assert (path / "counter").read_text() == "3\n"
    assert leftover_worktrees(history.path) == ""
    assert not worktrees.root.exists()


def test_a_git_worktree_add_killed_half_way_leaves_no_entry(history, before_git):
    def killed_while_initializing(argv: list[str]) -> None:
        subprocess.run(argv, cwd=history.path, check=True)
        path = Path(argv[-2])
        (path / ".git").unlink()  # as before git writes it, with the entry still locked "initializing"
        (history.path / ".git" / "worktrees" / path.name / "locked").write_text("initializing\n")
        raise gitpython.GitCommandError(argv, -signal.SIGKILL)
    before_git["add"] = killed_while_initializing
    worktrees = Worktrees(gitpython.Repo(history.path))
    with pytest.raises(gitpython.GitCommandError):
        with worktrees.checkout(history.shas[3]):
            pass
    worktrees.close()
    assert leftover_worktrees(history.path) == ""


def test_ctrl_c_while_stale_worktrees_are_removed_lets_the_removal_finish(history, before_git, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = tmp_path / f"{PREFIX}{dead.pid}-stale"
    for n, sha in enumerate(history.shas[1:4], 1):
        git(history.path, "worktree", "add", "--detach", "-q", str(root / f"{n:04d}-{sha[:12]}"), sha)
    before_git["remove"] = ctrl_c_at_the_first(1)
    with pytest.raises(KeyboardInterrupt):
        history.bisect()
    assert leftover_worktrees(history.path) == ""
    assert not root.exists()


# ---- the command line, Ctrl-C from a terminal: SIGINT to the whole process group ----------------

FAKE_GIT = """#!/bin/sh
# git, but `git worktree remove` deletes the worktree's directory first and then lingers: the moment
# in which a Ctrl-C that reaches git itself leaves a prunable .git/worktrees entry
if [ "$1 $2" = "worktree remove" ]; then
  for last; do :; done
  rm -rf "$last"
  touch "{marks}/remove-$$"
  sleep 0.5
fi
exec {git} "$@"
"""


def start_in_a_terminal(history, tmp: Path, marks: Path) -> subprocess.Popen:
    """`python -m replay bisect` as a terminal's foreground job: a process group of its own, SIGINT
    not ignored, git through FAKE_GIT; a probe writes marks/../probing when it starts."""
    tmp.mkdir()
    marks.mkdir()
    slow = f"touch {marks.parent / 'probing'}; sleep 1; test ! -f BUG"
    fake = marks.parent / "git"
    fake.write_text(FAKE_GIT.format(marks=marks, git=shutil.which("git")))
    fake.chmod(0o755)
    env = {**os.environ, "TMPDIR": str(tmp), "GIT_PYTHON_GIT_EXECUTABLE": str(fake)}
    return subprocess.Popen(
        [sys.executable, "-m", "replay", "bisect", "--good", history.shas[0], "--bad", "HEAD", "--run", slow],
        cwd=history.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + 120  # a loaded machine (fifteen test workers) took over 30 s to begin a probe
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.02)


MOMENTS = {
    "twice at once": ["group", "group"],
    "again while a worktree is removed": ["group", "removing", "group"],
    "twice more while a worktree is removed": ["group", "removing", "group", "group"],
    "SIGTERM, then Ctrl-C while a worktree is removed": ["term", "removing", "group", "group"],
}


@pytest.mark.parametrize("moments", MOMENTS.values(), ids=MOMENTS.keys())
def test_repeated_ctrl_c_from_a_terminal_leaves_no_worktree_and_nothing_prunable(history, tmp_path, moments):
    before = repo_state(history.path)
    marks = tmp_path / "marks"
    proc = start_in_a_terminal(history, tmp_path / "tmp", marks)
    wait_until(proc, (tmp_path / "probing").exists, "a probe")
    for moment in moments:
        if moment == "removing":
            wait_until(proc, lambda: any(marks.iterdir()), "a worktree removal")
        elif moment == "term":
            proc.send_signal(signal.SIGTERM)
        else:
            with_group_gone_ok(lambda: os.killpg(proc.pid, signal.SIGINT))
            time.sleep(0.05)
    _, stderr = proc.communicate(timeout=30)
    assert leftover_worktrees(history.path) == ""
    assert repo_state(history.path) == before
    assert list((tmp_path / "tmp").iterdir()) == []
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr


def with_group_gone_ok(send) -> None:
    try:
        send()
    except ProcessLookupError:  # the bisect has finished already: nothing more to interrupt
        pass


# ---- a damaged probe cache -----------------------------------------------------------------------

def entry(verdict: str, exit_code: object, **changes: object) -> dict:
    return {"verdict": verdict, "exit_code": exit_code, "reason": f"exit {exit_code}", "seconds": 0.1,
            "report": None, "output_tail": "", **changes}


def deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = {"a": value}
    return value


def for_every_commit(history, outcome: dict) -> bytes:
    """A cache whose entries, under the keys this bisect looks up, all hold `outcome`."""
    keys = ProbeCache(history.path / "unused.json", "-")
    return json.dumps({"version": 1, "entries": {keys._key(sha, CHECK): outcome for sha in history.shas}}).encode()


DAMAGED = {
    "a list": lambda h: b"[]",
    "a number": lambda h: b"5",
    "null": lambda h: b"null",
    "entries a list": lambda h: b'{"version": 1, "entries": []}',
    "an entry a number": lambda h: b'{"version":1,"entries":{"k": 5}}',
    "version a string": lambda h: b'{"version": "1", "entries": {}}',
    "version true": lambda h: b'{"version": true, "entries": {}}',
    "cut short": lambda h: b'{"version": 1, "entries": {"',
    "not UTF-8": lambda h: b'\xff\xfe\x00{"version": 1}\x80',
    "nested 100 000 deep": lambda h: b"[" * 100_000 + b"]" * 100_000,
    "entries nested deep": lambda h: b'{"version": 1, "entries": ' + b'{"k": ' * 5000 + b"0" + b"}" * 5001,
    "verdicts that are no verdicts": lambda h: for_every_commit(h, entry("maybe", 0)),
    "verdicts their exit codes contradict": lambda h: for_every_commit(h, entry("bad", 0)),
    "fields of the wrong types": lambda h: for_every_commit(h, entry("good", 0, seconds="soon", output_tail=7)),
    "exit code true": lambda h: for_every_commit(h, entry("bad", True)),
    "reports nested deep": lambda h: for_every_commit(h, entry("good", 0, report=deep(600))),
}


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_cache_is_probed_past_with_one_warning_and_rebuilt(history, damage, said):
    cache = history.path / ".git" / CACHE_NAME
    cache.write_bytes(damage(history))
    result = history.bisect()
    assert result.first_bad.sha == history.shas[5]
    assert result.probes_run == len(result.probes)  # nothing was taken from the damaged file
    warnings = said()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"replay: warning: {cache}: damaged (")
    assert warnings[0].endswith("probing again and rebuilding it")
    rebuilt = json.loads(cache.read_text())
    assert rebuilt["version"] == 1 and len(rebuilt["entries"]) == result.probes_run
    again = history.bisect()
    assert again.first_bad.sha == history.shas[5] and again.probes_run == 0
    assert said() == []


def test_the_command_line_says_so_in_one_line_and_answers(history):
    (history.path / ".git" / CACHE_NAME).write_text('{"version": 1, "entries": []}')
    result = CliRunner().invoke(main, ["bisect", "--good", history.shas[0], "--bad", "HEAD",
                                       "--repo", str(history.path), "--run", CHECK, "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["first_bad"]["sha"] == history.shas[5]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: warning: ") and CACHE_NAME in lines[0], lines


def test_a_cache_that_cannot_be_written_leaves_the_bisect_to_answer(history, said):
    (history.path / ".git" / CACHE_NAME).mkdir()
    result = history.bisect()
    assert result.first_bad.sha == history.shas[5]
    warnings = said()
    assert warnings and all(w.startswith("replay: warning: ") and CACHE_NAME in w for w in warnings), warnings
    assert len(warnings) <= 2  # unreadable, then unwritable: each once, not once a probe
