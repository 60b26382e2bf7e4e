"""The long mutation fuzz of the snapshot format (the CI test runs a few hundred cases of the same).

Each case is a seeded mutation of one recording (tests/fuzz.py: every kind of file, re-signed so
the deep parsers are reached) run through `replay show` and `replay run --call K`. Cases run in
worker processes, each case held to a time limit and each worker to a memory limit (its resident
memory, polled): a worker past either is killed, the case counted as a failure, and a new worker
started. A case fails too when a command exits outside 0, 1, 2, 125, prints a traceback or says it
met an internal error.

    python scripts/fuzz_snapshots.py --cases 5000 --jobs 2 --timeout 30 --memory-gb 3
"""
from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def worker(pristine: Path, scratch: Path) -> None:
    """Read seeds on stdin; for each, one JSON line on stdout: what was mutated and what went wrong."""
    sys.path.insert(0, str(TESTS))
    import fuzz

    for line in sys.stdin:
        seed = int(line)
        snapshot = scratch / f"case-{seed}"
        shutil.copytree(pristine, snapshot)
        rng = random.Random(seed)
        started = time.monotonic()
        what = fuzz.mutate(snapshot, rng)
        wrong = fuzz.check(snapshot, rng.randrange(3))
        shutil.rmtree(snapshot, ignore_errors=True)
        print(json.dumps({"seed": seed, "what": what, "wrong": wrong, "seconds": time.monotonic() - started}),
              flush=True)


def resident_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Tally:
    cases: int = 0
    failures: list[dict] = field(default_factory=list)
    slowest: float = 0.0
    peak_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, result: dict, peak: int) -> None:
        with self.lock:
            self.cases += 1
            self.slowest = max(self.slowest, result.get("seconds", 0.0))
            self.peak_bytes = max(self.peak_bytes, peak)
            if result["wrong"]:
                self.failures.append(result)
                print(f"FAIL seed {result['seed']}: {result['what']}: {result['wrong']}", file=sys.stderr, flush=True)


class Worker:
    def __init__(self, pristine: Path, scratch: Path):
        self.args = [sys.executable, __file__, "--worker", str(pristine), str(scratch)]
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, seed: int, timeout: float, memory: int) -> tuple[dict, int]:
        """The case's result and the worker's peak resident memory during it; a worker past a
        limit is killed and replaced, and the case is a failure."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        started, peak = time.monotonic(), 0
        try:
            while True:
                peak = max(peak, resident_bytes(self.proc.pid))
                if selector.select(timeout=0.05):
                    line = self.proc.stdout.readline()
                    if line:
                        return json.loads(line), peak
                    why = f"the worker died (exit {self.proc.wait()})"
                elif time.monotonic() - started > timeout:
                    why = f"took more than {timeout:g} s"
                elif peak > memory:
                    why = f"held {peak >> 20} MiB, more than {memory >> 20}"
                else:
                    continue
                self.proc.kill()
                self.proc.wait()
                self.proc = self._start()
                return {"seed": seed, "what": "(see the seed)", "wrong": [why], "seconds": time.monotonic() - started}, peak
        finally:
            selector.close()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed; cases take the next ones")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take")
    parser.add_argument("--memory-gb", type=float, default=3.0, help="resident memory a worker may hold")
    parser.add_argument("--worker", nargs=2, metavar=("PRISTINE", "SCRATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]))
        return
    sys.path.insert(0, str(TESTS))
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import fuzz

    root = Path(tempfile.mkdtemp(prefix="replay-fuzz-"))
    pristine = fuzz.record(root / "pristine")
    seeds = iter(range(args.seed, args.seed + args.cases))
    seeds_lock, tally, started = threading.Lock(), Tally(), time.monotonic()

    def drive() -> None:
        one = Worker(pristine, root)
        try:
            while True:
                with seeds_lock:
                    seed = next(seeds, None)
                if seed is None:
                    return
                tally.add(*one.run(seed, args.timeout, int(args.memory_gb * (1 << 30))))
                if tally.cases % 500 == 0:
                    print(f"{tally.cases} cases, {len(tally.failures)} failures", file=sys.stderr, flush=True)
        finally:
            one.close()

    threads = [threading.Thread(target=drive) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"cases": tally.cases, "failures": len(tally.failures), "seeds": [args.seed, args.seed + args.cases],
                      "slowest_case_s": round(tally.slowest, 2), "peak_worker_mib": tally.peak_bytes >> 20,
                      "wall_s": round(time.monotonic() - started, 1), "failed": tally.failures[:20]}, indent=2))
    sys.exit(1 if tally.failures else 0)


if __name__ == "__main__":
    main()
