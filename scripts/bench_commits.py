"""Run one benchmark script at two commits in the same session, interleaved, so that a change is
measured against its baseline on the same machine at the same time.

    python scripts/bench_commits.py --base 613aa6f [--head HEAD] [--rounds 2] scripts/bench_capture.py [ARGS]

Each commit is checked out into a temporary worktree (a directory given instead is used as it is:
where there is no git history, as on the device, `git archive` the base into one and carry it)
and its own copy of the script runs with that tree first on the import path, so each side imports its own harness and kernels (the installed
kernel-replay supplies only the dependencies). Rounds alternate base, head, base, head, ...; every
run's output is printed under a header naming the commit and round.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def run_at(worktree: Path, script: str, script_args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(worktree), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(worktree / script), *script_args], cwd=worktree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed at {worktree.name}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the baseline commit")
    parser.add_argument("--head", default="HEAD", help="the commit measured against it (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each commit, alternating")
    parser.add_argument("script", help="the benchmark script, relative to the repository root")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
        trees, added = {}, []
        for label, rev in (("base", args.base), ("head", args.head)):
            if Path(rev).is_dir():
                trees[label] = Path(rev).resolve()
                continue
            trees[label] = Path(tmp) / f"{label}-{git('rev-parse', '--short', rev)}"
            git("worktree", "add", "--detach", "-q", str(trees[label]), rev)
            added.append(trees[label])
        try:
            for round_ in range(1, args.rounds + 1):
                for label, tree in trees.items():
                    print(f"\n## {label} {tree.name}, round {round_}\n", flush=True)
                    print(run_at(tree, args.script, args.script_args), flush=True)
        finally:
            for tree in added:
                git("worktree", "remove", "--force", str(tree))


if __name__ == "__main__":
    main()
