"""What replay.verify costs the program it watches: the tiny model's decode loop and a 7B-shaped
MLP forward, with verification off and at sample 0.01, 0.1 and 1.0, in one process.

    PYTHONPATH=. python3 scripts/bench_verify.py [--device cuda|cpu] [--runs 5]

Each figure is the median wall time of --runs runs of the workload (synchronised at the end),
verification's pending checks drained after the timing (their cost to the program is what the
program waits for, not the checks themselves). The decode loop runs eagerly (no CUDA graph) in
every row, so that the rows differ in verification only; it is timed on a GPU only (on a CPU its
kernels run in the Triton interpreter). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch

import replay
from replay.tolerance import REDUCTION

SAMPLES = (None, 0.01, 0.1, 1.0)


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
    from kernels.model import TinyLlama

    model = TinyLlama(device=device, use_cuda_graph=False)

    def run() -> object:
        model.reset()
        model.prefill(list(range(8)))
        return [model.decode_step(t) for t in range(32)]
    return run


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
    import kernels  # noqa: F401  (registers the model's ops; the interpreter without a GPU)

    ops = {"7B-shaped MLP, 16 rows x 8": (mlp(args.device), ("bench_verify_linear",))}
    if args.device == "cuda":  # on a CPU the model's kernels run in the Triton interpreter: no timing to speak of
        ops["tiny model: prefill 8 + decode 32"] = (decode(args.device), tuple(kernels.OPS))
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; torch {torch.__version__}\n")
    print("| workload | off ms | " + " | ".join(f"sample {s} ms (x off)" for s in SAMPLES[1:]) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in SAMPLES[1:]) + " |")
    with tempfile.TemporaryDirectory() as tmp:
        replay.verify.configure(directory=tmp, seed=0)
        for name, (fn, names) in ops.items():
            fn()  # warm up: compile the kernels
            row = []
            for sample in SAMPLES:
                for op_name in names:
                    if sample is None:
                        replay.verify.stop(op_name)
                    else:
                        replay.verify(op_name, sample=sample)
                row.append(timed(fn, args.runs, args.device))
            for op_name in names:
                replay.verify.stop(op_name)
            off = row[0]
            print(f"| {name} | {off * 1e3:.1f} | " + " | ".join(f"{t * 1e3:.1f} ({t / off:.2f}x)" for t in row[1:])
                  + " |", flush=True)
    print(f"\ncounters: {replay.verify.counters()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
