"""Multi-rank recording on GPUs (issue 37): a tensor-parallel MLP block (scripts/tp_bench/run_step.py,
bf16, T tokens x H hidden x F intermediate, F split over the ranks, an all_reduce after) under
torchrun over NCCL, bare and recorded (`replay record -- torchrun ...`), against the same per-rank
shapes on one GPU alone; then the recording replayed (`replay run`), its ranks compared
(`replay diff --ranks`), and a planted stale position_buf on rank 1 named.

    PYTHONPATH=. python3 scripts/bench_ranks.py --ranks 2 [--steps 20] [--hidden 2048] [--ffn 8192]

Per row: the median step time bare and recorded (the recorded loop issues its copies; what is
left to write is then flushed, and counted), the bytes each rank recorded, the ratio of recorded
(loop + flush) to bare, and to the floor: the larger of the bare loop and the disk write of every
rank's bytes (the ranks share one disk; its rate measured first). The one-GPU row runs one rank's
shapes with no collective.
NCCL_NVLS_ENABLE=0 (no NVLink multicast) is kept set in every process.
Prints a Markdown table (pasted into docs/PERFORMANCE.md) and the replay checks' verdicts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "tp_bench"
REPLAY = [sys.executable, "-m", "replay"]


def launch(ranks: int, record_into: Path | None, env: dict[str, str]) -> list[dict]:
    """One run: each rank's JSON line."""
    program = ([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "run_step.py"]
               if ranks > 1 else [sys.executable, "run_step.py"])
    command = [*REPLAY, "record", "-o", str(record_into), "--", *program] if record_into else program
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(command, cwd=HERE, env={**env, "BENCH_OUT": out}, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        return [json.loads(path.read_text()) for path in sorted(Path(out).glob("rank-*.json"))]


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def disk_mb_per_s(root: Path, mb: int = 256) -> float:
    """A sequential write of `mb` MB with fsync, where the recordings go: the disk's rate here."""
    block = os.urandom(1 << 20)
    started = time.perf_counter()
    with open(root / "disk-probe", "wb") as f:
        for _ in range(mb):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    (root / "disk-probe").unlink()
    return mb / seconds


def replay(args: list[str]) -> tuple[int, dict]:
    done = subprocess.run([*REPLAY, *args, "--json", "-"], cwd=HERE, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONPATH": f"{Path.cwd()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    return done.returncode, json.loads(done.stdout) if done.stdout.startswith("{") else {"stderr": done.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-ranks-"))
    base = {**os.environ, "NCCL_NVLS_ENABLE": "0", "BENCH_STEPS": str(options.steps), "BENCH_T": str(options.tokens),
            "BENCH_H": str(options.hidden), "BENCH_F": str(options.ffn),
            "PYTHONPATH": f"{Path.cwd()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rows = []
    disk = disk_mb_per_s(root)
    try:
        for ranks in (1, options.ranks):
            env = {**base, "BENCH_SHARDS": str(options.ranks)}
            bare, recorded, flush, sizes = [], [], [], []
            for run in range(options.runs):
                bare.append(statistics.median(r["step_ms"] for r in launch(ranks, None, env)))
                target = root / f"r{ranks}-{run}"
                lines = launch(ranks, target, env)
                recorded.append(statistics.median(r["step_ms"] for r in lines))
                flush.append(statistics.median(r["flush_ms"] for r in lines))
                parts = sorted(target.glob("rank-*")) or [target]
                sizes.append(statistics.mean(size_mb(p) for p in parts))
            b, r, f = statistics.median(bare), statistics.median(recorded), statistics.median(flush)
            per_rank_s = (r * options.steps + f) / 1e3
            mb = statistics.median(sizes)
            floor_ms = max(b * options.steps, ranks * mb / disk * 1e3)  # the ranks share one disk
            rows.append((ranks, b, r, f, mb, (r * options.steps + f) / (b * options.steps), mb / per_rank_s,
                         floor_ms, (r * options.steps + f) / floor_ms))
        print(f"\nTP MLP block bf16, T={options.tokens} H={options.hidden} F={options.ffn} split over {options.ranks}, "
              f"{options.steps} timed steps (+3 warm-up recorded), median of {options.runs}\n")
        print(f"disk: {disk:.0f} MB/s (sequential write with fsync, one writer)\n")
        print("| ranks | bare step ms | recorded step ms | flush ms | MB a rank | recorded/bare | MB/s a rank "
              "| floor ms | recorded/floor |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for ranks, b, r, f, mb, ratio, rate, floor, over in rows:
            label = "1 (one rank's shapes, alone)" if ranks == 1 else str(ranks)
            print(f"| {label} | {b:.3f} | {r:.3f} | {f:.1f} | {mb:.1f} | {ratio:.2f}x | {rate:.0f} | {floor:.1f} "
                  f"| {over:.2f}x |")
        recording = root / f"r{options.ranks}-0"
        code, report = replay(["run", str(recording), "--code", "."])
        print(f"\nreplay run {options.ranks} ranks: exit {code}, collectives checked "
              f"{report.get('collectives_checked')}, failed {report.get('collectives_failed')}, "
              f"calls {[r['calls_checked'] for r in report.get('ranks', {}).values()]} {report.get('stderr', '')}")
        code, agreement = replay(["diff", "--ranks", str(recording)])
        print(f"replay diff --ranks (clean): exit {code}, agree {agreement.get('agree')}")
        stale = root / "stale"
        launch(options.ranks, stale, {**base, "BENCH_SHARDS": str(options.ranks), "BENCH_STALE_RANK": "1",
                                      "BENCH_STEPS": "2"})
        code, agreement = replay(["diff", "--ranks", str(stale)])
        first = agreement.get("first_divergence") or {}
        print(f"replay diff --ranks (rank 1 stale): exit {code}, first: rank(s) {first.get('differing_ranks')} "
              f"call {first.get('calls')} {first.get('op')} {first.get('tensor')}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
