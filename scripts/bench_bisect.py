#!/usr/bin/env python3
"""Probes and wall time of `replay bisect` against `git bisect run` on one synthetic history.

Builds a linear history of N commits (one file edited per commit, a BUG file planted at
a seeded position), then, for each test command, times `git bisect run` in a clone and
`python -m replay bisect --run` with 1 and K jobs and a cached rerun, counting the probes
each really ran (the command appends a line to a counter file). Prints a markdown table.

    python scripts/bench_bisect.py --commits 1000 --jobs 3
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replay.bisect import SyntheticCommit, write_history

PROBES = {"instant": "test ! -f BUG", "1 s probe": "sleep 1; test ! -f BUG"}


def build(path: Path, commits: int, bug_at: int) -> list[str]:
    history = [SyntheticCommit(f"commit {i}", {"counter": f"{i}\n", **({"BUG": "x\n"} if i == bug_at else {})})
               for i in range(commits + 1)]
    return write_history(path, history)


def counted(command: str, counter: Path) -> str:
    return f"echo probe >> {counter}; {command}"


def probes_in(counter: Path) -> int:
    n = len(counter.read_text().splitlines()) if counter.exists() else 0
    counter.unlink(missing_ok=True)
    return n


def git_bisect(repo: Path, good: str, command: str, counter: Path, work: Path) -> dict:
    clone = Path(tempfile.mkdtemp(dir=work, prefix="clone-"))
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    start = time.monotonic()
    subprocess.run(["git", "bisect", "start", "HEAD", good], cwd=clone, check=True, capture_output=True)
    out = subprocess.run(["git", "bisect", "run", "sh", "-c", counted(command, counter)], cwd=clone,
                         check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - start
    first_bad = next(line.split()[0] for line in out.splitlines() if line.endswith("is the first bad commit"))
    probes = probes_in(counter)
    return {"tool": "git bisect run", "probes": probes, "rounds": probes, "wall": wall, "first_bad": first_bad}


def replay_bisect(repo: Path, good: str, command: str, counter: Path, jobs: int, cached: bool) -> dict:
    argv = [sys.executable, "-m", "replay", "bisect", "--good", good, "--bad", "HEAD", "--repo", str(repo),
            "--run", counted(command, counter), "--jobs", str(jobs), "--json", "-", *([] if cached else ["--no-cache"])]
    start = time.monotonic()
    out = subprocess.run(argv, cwd=repo.parent, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - start
    answer = json.loads(out)
    label = f"replay bisect --jobs {jobs}" + (" (rerun, cached)" if cached else "")
    return {"tool": label, "probes": probes_in(counter), "rounds": answer["rounds"], "wall": wall,
            "in_process": answer["seconds"], "first_bad": answer["first_bad"]["sha"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    bug_at = random.Random(args.seed).randint(1, args.commits)
    print(f"{args.commits} commits, bug planted at commit {bug_at}; {platform.node()}, "
          f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}\n")
    print("| test | tool | probes run | search rounds | wall s | of which in-process s | answer |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        work = Path(tmp)
        repo, counter = work / "history", work / "probes.txt"
        shas = build(repo, args.commits, bug_at)
        for name, command in PROBES.items():
            runs = [git_bisect(repo, shas[0], command, counter, work),
                    replay_bisect(repo, shas[0], command, counter, jobs=1, cached=False),
                    replay_bisect(repo, shas[0], command, counter, jobs=args.jobs, cached=False),
                    replay_bisect(repo, shas[0], command, counter, jobs=1, cached=True)]
            for run in runs:
                verdict = "right" if run["first_bad"] == shas[bug_at] else f"WRONG {run['first_bad'][:10]}"
                in_process = f"{run['in_process']:.2f}" if "in_process" in run else ""
                print(f"| {name} | {run['tool']} | {run['probes']} | {run['rounds']} | {run['wall']:.2f} | "
                      f"{in_process} | {verdict} |")


if __name__ == "__main__":
    main()
