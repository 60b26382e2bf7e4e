"""What a check of replay.verify costs the program beyond its own time, step by step.

    PYTHONPATH=. python3 -P scripts/profile_checks.py                        # the tiny model's decode, on a GPU
    PYTHONPATH=. python3 -P scripts/profile_checks.py --variants built,burn,footprint,driver,burst-same
    python -P scripts/profile_checks.py --workload small --device cpu --runs 5   # one small op, anywhere

The workload's steps (the tiny model's 32 decode steps after a prefill of 8, or 40 steps of 50
calls of one small op) are timed one by one on the host, in runs verified at sample 0.01 without
the gate and unverified runs, alternating; each step's checks and their time inside
`Verifier._checked` are counted. Each variant replaces what a sampled call does:

  built       checked as the verifier does it
  burn        the plain call, then --spend microseconds of a tight loop (time alone, no footprint)
  footprint   the plain call, then about --spend microseconds of Python over thousands of functions
              and dicts (a large footprint of code and data, no device)
  driver      the plain call, then what a check asks of the CUDA driver: an event, a side stream's
              wait for it, a small graph replayed there, an event (a GPU only)
  burst-same  checked as built, sampling a quarter as often, each sampled call opening a window
              over its op's next three calls (as many checks, four at a time)
  burst-all   checked as built, sampling a tenth as often, each sampled call opening a window over
              the next call of every verified op

Printed for each variant: the run's growth (the medians' difference, and the means': with checks
in bursts a run holds few or many, and the mean says what they cost) and a sampled call's share of
the mean, the variant's own time a call, what the rest of a step with one costs against an
unverified step, and the steps after one. A step that costs more after a check than the variant's
own time says the check slows the program's own code after it (caches it cooled, the driver's
state); burn against footprint and driver says which part of a check does. A diagnosis, not a
benchmark: the figures of record come from scripts/bench_verify.py (docs/PERFORMANCE.md, "A
check's cost beyond its own time").
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_verify  # noqa: E402  (its workloads, its ops registered, its way of switching modes)

import replay  # noqa: E402
from replay.verify.verifier import Verifier  # noqa: E402

SAMPLE = 0.01
BURSTS = {"burst-same": 4, "burst-all": 10}  # how much less often each samples a call
FUNCTIONS = 3000  # the footprint variant's distinct functions and dicts
Step = Callable[[], object]


def workload(name: str, device: str) -> tuple[list[Step], list[Step], tuple[str, ...]]:
    """The untimed steps that start a run, the timed ones, and the ops they call."""
    if name == "tiny":
        import replay_kernels
        from replay_kernels.model import TinyLlama

        model = TinyLlama(device=device, use_cuda_graph=False)
        start: list[Step] = [model.reset, lambda: model.prefill(list(range(8)))]
        return start, [lambda t=t: model.decode_step(t) for t in range(32)], tuple(replay_kernels.OPS)
    x = torch.randn(8, 64, device=device)
    return [], [lambda: [bench_verify.doubled(x) for _ in range(50)] for _ in range(40)], ("bench_verify_small",)


def burn(microseconds: float) -> None:
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        pass


def footprint_of(microseconds: float) -> Callable[[], None]:
    """About `microseconds` of Python calling distinct functions over distinct dicts."""
    space: dict[str, Any] = {}
    exec("\n".join(f"def f{i}(d):\n    return sum(v * {i % 7 + 1} for v in d.values())" for i in range(FUNCTIONS)),
         space)
    pairs = [(space[f"f{i}"], {j: i * j for j in range(8)}) for i in range(FUNCTIONS)]

    def walk(count: int) -> None:
        for function, data in pairs[:count]:
            function(data)
    started = time.perf_counter()
    walk(FUNCTIONS)
    count = max(1, min(FUNCTIONS, int(FUNCTIONS * microseconds / 1e6 / (time.perf_counter() - started))))
    return lambda: walk(count)


def driver_calls() -> Callable[[], None]:
    """What a check asks of the driver: an event, a side stream's wait, a small graph's replay there, an event."""
    side, static = torch.cuda.Stream(), torch.zeros(4096, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(12):
            static.mul_(1.0001).add_(0.5)
    torch.cuda.synchronize()
    copied, done = torch.cuda.Event(), torch.cuda.Event()

    def calls(static: torch.Tensor = static) -> None:  # the graph's tensor kept alive: it writes there
        copied.record()
        side.wait_event(copied)
        graph.replay()
        done.record(side)
    return calls


def plain_then(extra: Callable[[], None]) -> Callable[..., Any]:
    def checked(self: Verifier, policy: Any, number: int, spec: Any, call: Callable[..., Any], signature: Any,
                args: tuple, kwargs: dict) -> Any:
        result = call(*args, **kwargs)
        extra()
        return result
    return checked


class Counted:
    """Verifier._checked replaced by `variant`, its calls and their time counted."""

    def __init__(self) -> None:
        self.calls, self.seconds = 0, 0.0
        self.built = Verifier._checked

    def use(self, variant: Callable[..., Any]) -> None:
        def checked(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return variant(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - started
        Verifier._checked = checked  # type: ignore[method-assign]

    def restore(self) -> None:
        Verifier._checked = self.built  # type: ignore[method-assign]


def bursts_of(kind: str | None) -> Callable[[], None]:
    """Verifier.schedule made to open a burst's window at each sampled call (`kind` None: as built)."""
    schedule = Verifier.schedule

    def scheduled(self: Verifier, policy: Any, after: int, sample: float | None = None) -> None:
        schedule(self, policy, after, sample)
        if kind == "burst-same":
            policy.window = max(policy.window, BURSTS[kind] - 1)
        elif kind == "burst-all":
            for other in list(self._policies):
                other.window = max(other.window, 1)
    Verifier.schedule = scheduled  # type: ignore[method-assign]
    return lambda: setattr(Verifier, "schedule", schedule)


def timed_run(start: list[Step], steps: list[Step], counted: Counted, device: str) -> tuple[float, list[tuple]]:
    """One run: its wall time, and each timed step's (seconds, checks, seconds in them)."""
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for step in start:
        step()
    times = []
    for step in steps:
        calls, seconds, started = counted.calls, counted.seconds, time.perf_counter()
        step()
        times.append((time.perf_counter() - started, counted.calls - calls, counted.seconds - seconds))
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - began
    replay.verify.drain(60)
    return wall, times


def report(name: str, verified: list[tuple[float, list[tuple]]], plain: list[tuple[float, list[tuple]]]) -> str:
    unverified = statistics.median(seconds for _, steps in plain for seconds, _, _ in steps)
    growth = statistics.median(wall for wall, _ in verified) - statistics.median(wall for wall, _ in plain)
    # with checks in bursts a run holds few or many: the mean run's growth is the cost of its checks
    mean_growth = statistics.fmean(wall for wall, _ in verified) - statistics.fmean(wall for wall, _ in plain)
    checks = statistics.mean(sum(n for _, n, _ in steps) for _, steps in verified)
    kinds: dict[str, list[float]] = collections.defaultdict(list)
    for _, steps in verified:
        since = None
        for seconds, n, inside in steps:
            if n:
                kinds["own time a call"].append(inside / n)
                kinds["rest of its step"].append(seconds - inside - unverified)
                since = 0
            elif since is not None:
                since += 1
                kinds[f"step +{min(since, 3)}{'+' if since >= 3 else ''}"].append(seconds - unverified)
    parts = "; ".join(f"{kind} {statistics.median(values) * 1e6:+.0f} us (n={len(values)})"
                      for kind, values in sorted(kinds.items()))
    return (f"{name}: run {growth * 1e6:+.0f} us (mean {mean_growth * 1e6:+.0f}), {checks:.1f} sampled calls a run, "
            f"{mean_growth / checks * 1e6 if checks else float('nan'):.0f} us each (mean); unverified step "
            f"{unverified * 1e6:.0f} us; {parts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workload", choices=("tiny", "small"), default=None,
                        help="tiny: the tiny model's decode (a GPU; the default there); small: one small op")
    parser.add_argument("--variants", default="built,burn,footprint,driver,burst-same,burst-all")
    parser.add_argument("--runs", type=int, default=31, help="runs of each kind (verified, unverified) a variant")
    parser.add_argument("--spend", type=float, default=250.0, help="microseconds burn and footprint spend a call")
    args = parser.parse_args()
    name = args.workload or ("tiny" if args.device == "cuda" else "small")
    variants = [v for v in args.variants.split(",") if v]
    known = {"built", "burn", "footprint", "driver", *BURSTS}
    if unknown := [v for v in variants if v not in known]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    if name == "tiny" and args.device != "cuda":
        parser.error("--workload tiny: the tiny model is timed on a GPU (on a CPU its kernels run in the interpreter)")
    if args.device != "cuda":
        variants = [v for v in variants if v != "driver"]  # nothing of the driver's to ask
    start, steps, ops = workload(name, args.device)
    counted = Counted()
    extras = {"burn": lambda: burn(args.spend), "footprint": footprint_of(args.spend)}
    if "driver" in variants:
        extras["driver"] = driver_calls()
    print(f"{name} on {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; sample {SAMPLE}, "
          f"gate off; {args.runs} runs of each kind a variant")
    with tempfile.TemporaryDirectory() as folder:
        replay.verify.configure(directory=folder, seed=0)
        modes = bench_verify.Modes(ops)
        try:
            for variant in variants:
                counted.use(plain_then(extras[variant]) if variant in extras else counted.built)
                undo = bursts_of(variant if variant in BURSTS else None)
                mode = (SAMPLE / BURSTS.get(variant, 1), False)
                runs: dict[bool, list[tuple[float, list[tuple]]]] = {True: [], False: []}
                try:
                    for n in range(-3, args.runs):  # three rounds untimed: kernels compiled, graphs captured
                        for verified in ((True, False) if n % 2 else (False, True)):
                            modes.set(mode if verified else None)
                            done = timed_run(start, steps, counted, args.device)
                            if n >= 0:
                                runs[verified].append(done)
                finally:
                    undo()
                print(report(variant, runs[True], runs[False]))
        finally:
            counted.restore()
            modes.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
