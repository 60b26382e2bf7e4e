"""What a recording's writer threads cost the program through the interpreter lock: Liger-Kernel's
llama block (as scripts/bench_launches.py runs it) recorded step after step in one process, in
blocks of steps that take turns:

    working     the writers write each call as it comes (the recording as it always runs)
    held        the writers held still (their work waits until the block has ended): what the
                program's own threads cost, with nothing taking the lock from them
    si<ms>      working, under another switch interval (`--switch-intervals 5,1`: the
                interpreter's default 5 ms, then 1 ms; the recording sets its own otherwise)

    python scripts/writers_held.py                          # on a GPU: 2048 tokens, hidden 4096, bf16
    python scripts/writers_held.py --switch-intervals 5,1 --rounds 10
    python scripts/writers_held.py --shape 8 64 2 128 96 --rounds 2 --block 2    # CPU smoke
    python scripts/writers_held.py --small-op 60 --block 1 --switch-intervals 5  # 60 calls of a small op a step

The writers write about half a megabyte a later step here, yet held they cost the program no
time at all: what `working` costs over `held` is their Python holding the lock that the program's
threads let go of in every torch operator and kernel launch and then wait to take back. Blocks
alternate (their order reversed every round) and the recording is flushed between them, so each
kind sees the same process, recording and machine; printed: each kind's median and mean step (ms)
and the bare step's. A diagnosis, not a benchmark: figures for docs/PERFORMANCE.md come from
bench_launches.py.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_launches  # noqa: E402  (the block and its inputs, loaded the same way)


def hold_writers() -> threading.Event:
    """An event the writers wait on before each call they write (set: they go on; a minute at most)."""
    from replay.recorder import pipeline

    going = threading.Event()
    going.set()
    finish = pipeline.CallWriter._finish

    def held(self: Any, *args: Any) -> None:
        going.wait(timeout=60)  # never a hang: a block that fills the writers' queue goes on after a minute
        finish(self, *args)
    pipeline.CallWriter._finish = held  # type: ignore[method-assign]
    return going


def small_op_step(calls: int) -> Callable[[], float]:
    """A step of `calls` calls of a small registered op (four arguments, one written in place), timed."""
    import torch

    import replay

    @replay.capture("writers_held_small_op", mutates=("cache",))
    def small_op(x: torch.Tensor, w: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cache[positions] = x @ w
        return x * 2

    x, w, cache, positions = torch.randn(4, 64), torch.randn(64, 64), torch.zeros(64, 64), torch.arange(4)

    def step() -> float:
        started = time.perf_counter()
        for n in range(calls):
            small_op(x, w, cache, (positions + n) % 64)
        return (time.perf_counter() - started) * 1e3
    return step


def run(shape: list[int], rounds: int, block: int, intervals: list[float], small_op: int = 0) -> dict[str, list[float]]:
    """Each kind's step times (ms), `block` steps a turn, `rounds` turns each; 'bare' first. A step is
    the Liger block's at `shape`, or with `small_op`, that many calls of a small op."""
    import replay

    going = hold_writers()
    step = small_op_step(small_op) if small_op else bench_launches.timed_step(shape)
    step()  # compiles every kernel
    times: dict[str, list[float]] = {"bare": [step() for _ in range(block)], "working": [], "held": []}
    times.update({f"si{ms:g}": [] for ms in intervals})
    kinds = [kind for kind in times if kind != "bare"]
    with replay.recording(Path(tempfile.mkdtemp()) / "writers_held") as recording:
        step()
        recording.flush()  # the first step's new bytes written: later steps are the steady state
        for turn in range(rounds):
            for kind in kinds if turn % 2 == 0 else kinds[::-1]:
                recording.flush()
                own = sys.getswitchinterval()
                if kind.startswith("si"):
                    sys.setswitchinterval(float(kind[2:]) / 1e3)
                if kind == "held":
                    going.clear()
                try:
                    times[kind] += [step() for _ in range(block)]
                finally:
                    going.set()
                    sys.setswitchinterval(own)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_launches.add_shape(parser)
    parser.add_argument("--rounds", type=int, default=10, help="turns of each kind")
    parser.add_argument("--block", type=int, default=3,
                        help="steps a turn (a held block must fit the writers' queue, 64 calls, and the device "
                             "staging budget, 4 GiB: six steps of the Liger block do not, and wait 5 s)")
    parser.add_argument("--switch-intervals", default="", help="comma-separated milliseconds, each a kind of its own")
    parser.add_argument("--small-op", type=int, default=0, metavar="CALLS",
                        help="a step of CALLS calls of a small registered op instead of the Liger block")
    args = parser.parse_args()
    intervals = [float(ms) for ms in args.switch_intervals.split(",") if ms]
    times = run(args.shape, args.rounds, args.block, intervals, args.small_op)
    print("| kind | steps | median ms | mean ms |")
    print("| --- | ---: | ---: | ---: |")
    for kind, steps in times.items():
        print(f"| {kind} | {len(steps)} | {statistics.median(steps):.2f} | {statistics.mean(steps):.2f} |")


if __name__ == "__main__":
    main()
