"""What replay.verify costs the program it watches: the tiny model's decode loop and a 7B-shaped
MLP forward, with verification off and at sample 0.01, 0.1 and 1.0, in one process.

    PYTHONPATH=. python3 scripts/bench_verify.py [--device cuda|cpu] [--runs 5]

Each figure is the median wall time of --runs runs of the workload (synchronised at the end),
verification's pending checks drained after the timing (their cost to the program is what the
program waits for, not the checks themselves). The decode loop runs eagerly (no CUDA graph) in
every row, so that the rows differ in verification only; it is timed on a GPU only (on a CPU its
kernels run in the Triton interpreter). Floors are timed with them: every call routed through
a hook that only calls the op (what any per-call check must pay to run at all); the same hook
waiting for the GPU before each call (what any gate that reads the call's tensors on the host
must pay); the hook running the op's reference after every call, from which the least that
checking 1% of calls can cost follows (1% of what the reference adds: the reference shares the
GPU). Prints a Markdown table, one row per mode.
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch

import replay
from replay import recorder
from replay.recorder.staging import CallSpec
from replay.registry import get_op
from replay.verify.gate import features
from replay.tolerance import REDUCTION

# (label, how verification is set for an op): None off; a float the sampling rate (gate on);
# (rate, False) the rate with the gate off; a str a floor hook
MODES: tuple[tuple[str, object], ...] = (
    ("off", None), ("floor: every call through a hook", "hook"),
    ("floor: the hook waits for the GPU", "sync"), ("the hook runs the reference after every call", "reference"),
    ("the hook reads the outlier gate's statistics", "features"),
    ("sample 0.01, outlier gate off", (0.01, False)),
    ("sample 0.01", 0.01), ("sample 0.1", 0.1), ("sample 1.0", 1.0))


replay.op("bench_verify_linear", tolerance=REDUCTION)


@replay.capture("bench_verify_linear")
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()


@replay.capture("bench_verify_linear", "reference")
def linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().t()).to(x.dtype)


def mlp(device: str) -> Callable[[], object]:
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    size = (4096, 11008) if device == "cuda" else (1024, 2752)  # 7B-shaped on the GPU, a quarter on a CPU
    w_gate, w_up = (torch.randn(size[1], size[0], device=device, generator=gen) / size[0] ** 0.5 for _ in range(2))
    w_down = torch.randn(size[0], size[1], device=device, generator=gen) / size[1] ** 0.5
    w_gate, w_up, w_down = (w.to(dtype) for w in (w_gate, w_up, w_down))
    x = torch.randn(16, size[0], device=device, generator=gen, dtype=dtype)
    return lambda: [linear(torch.nn.functional.silu(linear(x, w_gate)) * linear(x, w_up), w_down) for _ in range(8)]


def decode(device: str) -> Callable[[], object]:
    from replay_kernels.model import TinyLlama

    model = TinyLlama(device=device, use_cuda_graph=False)

    def run() -> object:
        model.reset()
        model.prefill(list(range(8)))
        return [model.decode_step(t) for t in range(32)]
    return run


def floor_hook(kind: str) -> Callable[..., object]:
    """A verifier hook that checks nothing: it calls the op, after waiting for the GPU ("sync") or
    reading the gate's statistics of its arguments ("features"), or and then its reference on the
    same arguments ("reference": what checking every call costs at the least; the model's ops
    that write in place write the same values again)."""
    def hook(spec: CallSpec, call: Callable[..., object], signature: inspect.Signature, args: tuple,
             kwargs: dict) -> object:
        if kind == "sync":
            torch.cuda.current_stream().synchronize()
        elif kind == "features":
            features(signature.bind(*args, **kwargs).arguments.values())
        result = call(*args, **kwargs)
        if kind == "reference":
            get_op(spec.op).get("reference").fn(*args, **kwargs)
        return result
    return hook


def set_mode(names: tuple[str, ...], mode: object) -> None:
    for op_name in names:
        replay.verify.stop(op_name)
        if isinstance(mode, str):
            recorder.set_verifier(op_name, floor_hook(mode))
        elif isinstance(mode, tuple):
            replay.verify(op_name, sample=mode[0], outliers=mode[1])
        elif mode is not None:
            replay.verify(op_name, sample=mode)


def timed(fn: Callable[[], object], runs: int, device: str) -> float:
    times = []
    for _ in range(runs):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        replay.verify.drain(60)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import replay_kernels  # noqa: F401  (registers the model's ops; the interpreter without a GPU)

    workloads = {"7B-shaped MLP, 16 rows x 8": (mlp(args.device), ("bench_verify_linear",))}
    if args.device == "cuda":  # on a CPU the model's kernels run in the Triton interpreter: no timing to speak of
        workloads["tiny model: prefill 8 + decode 32"] = (decode(args.device), tuple(replay_kernels.OPS))
    modes = [(label, mode) for label, mode in MODES if args.device == "cuda" or mode != "sync"]
    times: dict[str, list[float]] = {}
    checks: dict[str, list[str]] = {}  # per mode and workload: checks (of them flagged) per run
    with tempfile.TemporaryDirectory() as tmp:
        replay.verify.configure(directory=tmp, seed=0)
        for name, (fn, names) in workloads.items():
            fn()  # warm up: compile the kernels
            for label, mode in modes:
                set_mode(names, mode)
                before = replay.verify.counters()
                times.setdefault(label, []).append(timed(fn, args.runs, args.device))
                done = {key: (value - before[key]) / args.runs for key, value in replay.verify.counters().items()}
                checks.setdefault(label, []).append(f"; {done['checked']:.1f} checks/run, {done['flagged']:.1f} flagged"
                                                    if done["checked"] or done["flagged"] else "")
            set_mode(names, None)
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; torch {torch.__version__}\n")
    print("| mode | " + " | ".join(f"{name}: ms (x off)" for name in workloads) + " |")
    print("| --- | " + " | ".join("---:" for _ in workloads) + " |")
    for label, row in times.items():
        print(f"| {label} | " + " | ".join(f"{t * 1e3:.1f} ({t / off:.3f}x{done})"
                                           for t, off, done in zip(row, times["off"], checks[label])) + " |")
    # checking a share s of calls costs at least s times what running the reference after every call adds
    floor = [off + 0.01 * (ref - hook) for off, ref, hook in zip(times["off"], times[MODES[3][0]], times[MODES[1][0]])]
    print("| floor at sample 0.01: 1% of the reference's own cost | "
          + " | ".join(f"{t * 1e3:.1f} ({t / off:.3f}x)" for t, off in zip(floor, times["off"])) + " |")
    print(f"\ncounters: {replay.verify.counters()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
