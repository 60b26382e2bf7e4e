"""What recording must cost an eager program of small calls, whatever the recorder: the floor of a
Python hook that records.

A recorder of eager calls runs Python at every call (it must see the call's arguments before the
call runs: the next call may overwrite them), and a recorder that keeps the call's data must issue
at least one device operation at every call (a copy of what the call reads, before a later call
changes it). On a model whose calls take a few microseconds each, those two alone bound what any
recording can reach against the bare run. Measured on the workloads of scripts/bench_capture.py
(--gpu), each the median of --runs:

    bare              the workload alone
    hook only         every registered call goes through a recorder that binds its arguments and
                      keeps them (no copy): the least any Python-level recorder runs
    + one copy        and copies one tensor of each call, device to device (the least a recorder
                      that keeps data issues)
    copies, no files  kernel-replay's flight recorder (every tensor of every call copied to the
                      host; no writer thread, no file)
    recorded          kernel-replay's recording, until it is closed

    python3 scripts/bench_call_floor.py [--runs 3] [--only TEXT]     # on a GPU machine
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import gpu_workloads, timed  # noqa: E402  (a script beside this one)

from replay.recorder import staging  # noqa: E402
from replay.recorder.session import Recording  # noqa: E402


@contextlib.contextmanager
def minimal_recorder(copy_one: bool) -> Iterator[list[Any]]:
    """Recording.record replaced by the least a recorder does: bind the call's arguments and keep
    them; with `copy_one`, also copy its first tensor on the device."""
    kept: list[Any] = []

    def record(self: Recording, spec: staging.CallSpec, fn: Callable, signature: inspect.Signature,
               args: tuple, kwargs: dict) -> Any:
        bound = signature.bind(*args, **kwargs)
        kept.append(bound.arguments)
        if copy_one:
            first = next((v for v in bound.arguments.values() if isinstance(v, torch.Tensor)), None)
            if first is not None:
                kept.append(first.clone())
        return fn(*args, **kwargs)

    real = Recording.record
    Recording.record = record  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        Recording.record = real  # type: ignore[method-assign]


def hooked(fn: Callable[[], object], into: Path, copy_one: bool, runs: int) -> float:
    with minimal_recorder(copy_one):  # the door for unregistered launches stays shut: no launch is one
        return timed(fn, into, runs, triton=False)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per timing (the median is reported)")
    parser.add_argument("--only", metavar="TEXT", default="", help="the workloads whose name holds TEXT")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}\n")
    print("| workload | bare ms | hook only ms (x bare) | + one copy a call (x bare) "
          "| copies, no files: flight recorder (x bare) | recorded, closed (x bare) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (fn, use_graph) in gpu_workloads().items():
            if args.only not in name:
                continue
            if use_graph is not None:  # eager: a CUDA graph's replays go through no hook at all
                use_graph(False)
                name += " (eager)"
            fn()  # compile the kernels
            timed(fn, Path(tmp) / "warm", 1)
            timed(fn, Path(tmp) / "warm", 1, ring=64)
            bare = timed(fn, None, args.runs)[0]
            hook = hooked(fn, Path(tmp) / "hook", False, args.runs)
            one_copy = hooked(fn, Path(tmp) / "copy", True, args.runs)
            flight = timed(fn, Path(tmp) / "ring", args.runs, ring=64)[1]
            closed = timed(fn, Path(tmp) / "pipe", args.runs)[1]
            print(f"| {name} | {bare * 1e3:.1f} | {hook * 1e3:.1f} ({hook / bare:.2f}x) "
                  f"| {one_copy * 1e3:.1f} ({one_copy / bare:.2f}x) | {flight * 1e3:.1f} ({flight / bare:.2f}x) "
                  f"| {closed * 1e3:.1f} ({closed / bare:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
