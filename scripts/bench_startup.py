"""What a `replay` process costs before it does anything: every command, every bisect probe (a
`replay run` a commit) and every program `replay record` runs pays it once.

    python scripts/bench_startup.py                       # 7 runs of each, medians
    python scripts/bench_startup.py --runs 11 --against /tmp/old-tree   # and another tree's replay, side by side

Each row is a fresh Python process, timed from its start to its exit: importing torch (the
floor: replay cannot start before torch has), importing replay's command line, `replay --help`,
and `replay show` of the bundled snapshot. Printed: medians in ms and their ratio to the floor.
With `--against DIR`, the replay rows run again with DIR's replay package first on PYTHONPATH
(a `git worktree` of an older commit), in the same run, alternating with this tree's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "snapshots" / "prefill_001"
CLI = "import sys; from replay.cli import main; sys.argv[0] = 'replay'; main()"
ROWS = {
    "python -c 'import torch' (the floor)": ["-c", "import torch"],
    "python -c 'import replay.cli'": ["-c", "import replay.cli"],
    "replay --help": ["-c", CLI, "--help"],
    "replay show snapshots/prefill_001": ["-c", CLI, "show", str(SNAPSHOT)],
}


def seconds(arguments: list[str], tree: Path) -> float:
    """One fresh interpreter running `arguments` with `tree`'s replay first on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    # -P: `-c` would put the working directory first on the path, ahead of `tree` (run from a
    # checkout, every tree's rows would import that checkout's replay)
    subprocess.run([sys.executable, "-P", *arguments], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another tree whose replay package runs the same rows")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be at least 1")
    if args.against is not None and not (args.against / "replay" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: no kernel-replay tree there (no replay/__init__.py)")
    trees = {"this tree": ROOT, **({f"{args.against}": args.against} if args.against else {})}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.runs):  # rows and trees take turns, so a busy moment falls on all of them
        for row, arguments in ROWS.items():
            for name, tree in trees.items():
                if row.startswith("python -c 'import torch'") and name != "this tree":
                    continue
                times.setdefault((row, name), []).append(seconds(arguments, tree))
    floor = statistics.median(times[next(iter(ROWS)), "this tree"])
    print(f"{args.runs} runs each, medians; Python {sys.version.split()[0]}\n")
    print("| process | tree | ms | x the floor |")
    print("| --- | --- | ---: | ---: |")
    for (row, name), taken in times.items():
        median = statistics.median(taken)
        print(f"| {row} | {name} | {median * 1e3:.0f} | {median / floor:.2f}x |")


if __name__ == "__main__":
    main()
