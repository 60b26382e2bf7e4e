"""How much of a replay is loading the snapshot, and how much is running kernels.

    python scripts/bench_replay.py [SNAPSHOT] [--repeats 3]

Replays SNAPSHOT (default snapshots/prefill_001) with every variant, several times,
and prints load time (reading, verifying and rebuilding each call's tensors) against
total time, plus the bare read-and-verify time of the whole snapshot.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from replay.device import use_interpreter_without_gpu

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", nargs="?", type=Path, default=ROOT / "snapshots" / "prefill_001")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = use_interpreter_without_gpu()
    from replay.engine import ReplayOptions, replay_snapshot
    from replay.snapshot import Snapshot

    reads = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for _record in Snapshot(args.snapshot):
            pass
        reads.append(time.perf_counter() - started)
    loads, totals = [], []
    for _ in range(args.repeats):
        report = replay_snapshot(args.snapshot, ReplayOptions(device=device))
        loads.append(report.load_seconds)
        totals.append(report.total_seconds)
    calls = len(report.calls)
    load, total, read = statistics.median(loads), statistics.median(totals), statistics.median(reads)
    print(f"snapshot {args.snapshot} ({calls} calls) on {device}, median of {args.repeats}:")
    print(f"| read + verify all calls | {read * 1e3:.1f} ms |")
    print(f"| replay: loading | {load * 1e3:.1f} ms |")
    print(f"| replay: total | {total * 1e3:.1f} ms |")
    print(f"| loading / total | {load / total:.2%} |")


if __name__ == "__main__":
    main()
