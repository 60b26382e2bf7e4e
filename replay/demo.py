"""`replay demo`: the whole loop on an embedded default, start to finish.

It builds a throwaway git repository holding a kernel history (the `replay_kernels`
package shipped with this project, then about 30 commits of edits to it: tuning
notes, comments, one harmless refactor, and one commit that plants the
stale-position_buf prefill bug), records a prefill snapshot at the good tag,
then bisects to the planted commit with `replay run` as the probe. The endpoint
probes are the `replay run` verdicts at the good tag and at HEAD.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from replay.bisect import BisectOptions, BisectResult, Step, SyntheticCommit, run_bisect, write_history
from replay.bisect.probe import HARNESS_ROOT
from replay.errors import ReplayError

GOOD_TAG = "v1.2"
PROMPT_LEN = 4
PROVIDER_PACKAGE = "replay_kernels"  # the bundled kernels' import name (the repository's kernels/)

# The planted bug: a new batched scatter that always takes the indirect path, so a prefill
# writes every token where the stale position_buf points (position 0). Its code is the faulty
# variant kept in bugs.py, appended to kv_scatter.py as that op's batched variant.
BUG_FILE = f"{PROVIDER_PACKAGE}/kv_scatter.py"
BUG_SOURCE_FILE = f"{PROVIDER_PACKAGE}/bugs.py"
BUG_FUNCTION = "kv_scatter_graph_ready"
BUG_DECORATOR = "@kv_scatter.batched"
BUG_SUBJECT = "kv_scatter: always read position_buf so prefill can be graph-captured"

REFACTOR_FILE = f"{PROVIDER_PACKAGE}/kv_scatter.py"
REFACTOR_PATTERN = re.compile(r"\bgeom\b")
REFACTOR_SUBJECT = "kv_scatter: rename geom to cache_geometry"

TUNING_NOTES = [
    ("rmsnorm", "one program per row; 16-byte loads"), ("residual_add", "fused store, no extra pass"),
    ("rope", "neox layout: pairs (i, i+D/2)"), ("swiglu", "silu in fp32, product in fp32"),
    ("q4k_gemv", "unpack 6-bit scales once per super-block"), ("q6k_gemv", "ql/qh merged in registers"),
    ("attention", "key blocks of fixed size keep row reductions independent of batch"),
    ("kv_scatter", "paged and contiguous layouts share one kernel"),
]
COMMENT_FILES = [f"{PROVIDER_PACKAGE}/{name}.py" for name in ("rmsnorm", "rope", "swiglu", "attention", "residual_add")]
HISTORY_LENGTH = 30
REFACTOR_AT = 8
BUG_AT = 19


@dataclass
class DemoResult:
    directory: Path
    repo: Path
    snapshot: Path
    planted_sha: str
    bisect: BisectResult

    @property
    def found_planted(self) -> bool:
        return self.bisect.first_bad is not None and self.bisect.first_bad.sha == self.planted_sha


def kernel_sources() -> dict[str, str]:
    """The shipped kernels package as {repo path: text}."""
    spec = importlib.util.find_spec(PROVIDER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ReplayError(f"the '{PROVIDER_PACKAGE}' package is not installed: the demo has no kernels to use")
    root = Path(list(spec.submodule_search_locations)[0])
    return {f"{PROVIDER_PACKAGE}/{p.relative_to(root).as_posix()}": p.read_text()
            for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def planted_bug_patch(sources: dict[str, str]) -> str:
    """The text the planted commit appends to BUG_FILE: BUG_FUNCTION from bugs.py,
    registered as kv_scatter's batched variant (it replaces the correct one)."""
    text = sources.get(BUG_SOURCE_FILE, "")
    found = [node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name == BUG_FUNCTION]
    if not found:
        raise ReplayError(f"{BUG_SOURCE_FILE}: no function {BUG_FUNCTION}() to plant; the demo's history is out of date")
    return f"\n\n{BUG_DECORATOR}\n{ast.get_source_segment(text, found[0])}\n"


def kernel_history(sources: dict[str, str]) -> list[SyntheticCommit]:
    """The demo's commits: the good import first, the planted bug at BUG_AT."""
    files = dict(sources)
    notes = "# Tuning log\n"
    commits = [SyntheticCommit(f"kernels: import the {GOOD_TAG} kernels", dict(files))]
    for i in range(1, HISTORY_LENGTH):
        if i == REFACTOR_AT:
            text, count = REFACTOR_PATTERN.subn("cache_geometry", files[REFACTOR_FILE])
            if not count:
                raise ReplayError(f"{REFACTOR_FILE}: nothing named 'geom' to rename; the demo's history is out of date")
            files[REFACTOR_FILE] = text
            commits.append(SyntheticCommit(REFACTOR_SUBJECT, {REFACTOR_FILE: text}))
        elif i == BUG_AT:
            files[BUG_FILE] = files[BUG_FILE] + planted_bug_patch(files)
            commits.append(SyntheticCommit(BUG_SUBJECT, {BUG_FILE: files[BUG_FILE]}))
        elif i % 3 == 0:
            path = COMMENT_FILES[i % len(COMMENT_FILES)]
            files[path] = files[path] + f"# reviewed in change {i}: no functional change\n"
            commits.append(SyntheticCommit(f"{Path(path).stem}: review notes", {path: files[path]}))
        else:
            op, note = TUNING_NOTES[i % len(TUNING_NOTES)]
            notes += f"- change {i}, {op}: {note}\n"
            commits.append(SyntheticCommit(f"{op}: tuning note", {f"{PROVIDER_PACKAGE}/TUNING.md": notes}))
    return commits


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def record_snapshot(checkout: Path, out: Path, prompt_len: int = PROMPT_LEN) -> None:
    """Record the tiny model's prefill with the kernels of `checkout`, in a fresh process."""
    script = ("import sys; from replay_kernels.model import record_prefill; "
              "record_prefill(sys.argv[1], prompt_len=int(sys.argv[2]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(HARNESS_ROOT)])}
    done = subprocess.run([sys.executable, "-c", script, str(out), str(prompt_len)], cwd=checkout, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ReplayError(f"recording the prefill at {checkout} failed: {tail}")


def prepare_directory(directory: Path | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="replay-demo-"))
    if directory.exists() and any(directory.iterdir()):
        raise ReplayError(f"{directory}: not empty; give the demo a new or empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    return directory.resolve()


def run_demo(directory: Path | None, say: Callable[[str], None], on_step: Callable[[Step], None] | None = None,
             jobs: int = 1) -> DemoResult:
    """Build the history, record at the good tag, bisect to the planted commit."""
    directory = prepare_directory(directory)
    repo = directory / "kernel-history"
    commits = kernel_history(kernel_sources())
    shas = write_history(repo, commits)
    _git(repo, "tag", GOOD_TAG, shas[0])
    say(f"built {repo}: {len(shas)} commits of {PROVIDER_PACKAGE}/ edits; {GOOD_TAG} = {shas[0][:10]}, "
        f"HEAD = {shas[-1][:10]} (one commit plants a bug; can you spot it in `git log`?)")
    good_checkout = directory / f"at-{GOOD_TAG}"
    _git(repo, "worktree", "add", "-q", "--detach", str(good_checkout), GOOD_TAG)
    snapshot = directory / "snapshots" / "prefill_001"
    say(f"recording a {PROMPT_LEN}-token prefill of the tiny model with the {GOOD_TAG} kernels "
        f"into {snapshot}")
    record_snapshot(good_checkout, snapshot)
    _git(repo, "worktree", "remove", "--force", str(good_checkout))
    say(f"bisecting: replay bisect --good {GOOD_TAG} --bad HEAD {snapshot} --repo {repo}")
    result = run_bisect(BisectOptions(good=GOOD_TAG, bad="HEAD", snapshot=snapshot, repo=repo, jobs=jobs),
                        on_step)
    return DemoResult(directory, repo, snapshot, shas[BUG_AT], result)
