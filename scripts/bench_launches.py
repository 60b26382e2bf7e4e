"""What recording every Triton launch costs a real program: Liger-Kernel's llama block
(tests/liger_block/block.py: RMSNorm, RoPE, SwiGLU, cross-entropy; forward and backward), each way
of running it in a process of its own, the same batch every step:

    bare                nothing installed
    door                a recording whose filter keeps no launch: the cost of the door alone
    record              kernel-replay recording every launch's inputs and outputs
    tritonparse         tritonparse tracing launches (metadata, no tensors)
    tritonparse-blobs   tritonparse tracing launches with its tensor blobs on (inputs only)

    python scripts/bench_launches.py                       # on a GPU: 2048 tokens, hidden 4096, bf16
    python scripts/bench_launches.py --shape 8 64 2 128 96 --steps 3 --modes bare,door,record   # CPU smoke
    git worktree add /tmp/base v1 && python scripts/bench_launches.py --against /tmp/base --rounds 5

With `--against TREE` (another kernel-replay tree: a worktree, or a `git archive` unpacked), each
round runs bare, then `record` with this tree's package and with TREE's (which goes first
alternates), each in a process of its own: one process's later steps vary by 15-20% from the
next's, so a change of a few percent shows only in the medians of several rounds, printed last.

The first timed step comes after one warm-up step that compiles every kernel of the block. The
recorder's own kernels (checksums, output buffers' masks) compile at a recording's first launches,
once per machine (Triton keeps them in its cache on disk): a one-step recording runs first to
compile them, as the warm-up step does the block's, and its first step is printed as the cold
one, what a machine's first recording pays. Printed: per mode,
the first step and the median of the later ones (ms), each against bare, the extra microseconds a
launch, the bytes written and what was captured. A recording's first step stores ~1 GB of new
bytes, which its writers take longer than the step to put on disk: its recording is flushed after
that step and the time until its bytes are written is its own column, held against the capture
issue's bound (1.25x the larger of bare, D2H and disk for those bytes); the later steps are timed
after it, the steady state of a program whose steps repeat.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BLOCK = ROOT / "tests" / "liger_block" / "block.py"
MODES = ("bare", "door", "record", "tritonparse", "tritonparse-blobs")
CAPTURED = {"bare": "nothing", "door": "nothing (every launch filtered out)", "record": "inputs and outputs",
            "tritonparse": "launch metadata", "tritonparse-blobs": "launch metadata and input tensors"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape(parser)
    parser.add_argument("--steps", type=int, default=13, help="timed steps after the warm-up one")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--against", type=Path, metavar="TREE",
                        help="another kernel-replay tree whose recording alternates with this one's, round by round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds with --against")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_mode(args.child, args.shape, args.steps, Path(args.dir))))
        return
    if args.against is not None:
        if not (args.against / "replay" / "__init__.py").is_file():
            parser.error(f"--against {args.against}: no kernel-replay tree there (no replay/__init__.py)")
        compare(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-launches-", dir=os.environ.get("BENCH_DIR")) as tmp:
        cold = run_child("record", Path(tmp) / "cold", args, steps=1) if "record" in modes else None
        for mode in modes:
            results[mode] = run_child(mode, Path(tmp) / mode, args)
        floors = bandwidth_floors(Path(tmp))
    print_table(results, args, floors)
    if cold is not None:
        print_cold(cold)


def run_child(mode: str, target: Path, args: argparse.Namespace, tree: Path = ROOT,
              steps: int | None = None) -> dict[str, Any]:
    """One mode in a process of its own, importing `replay` from `tree`, for `steps` timed steps
    (args.steps unless given): its results, or its error."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    command = [sys.executable, __file__, "--child", mode, "--dir", str(target), "--steps", str(steps or args.steps),
               "--shape", *map(str, args.shape)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    """Rounds of bare, this tree's recording and the other's, alternating which recording goes first."""
    trees = {"this tree": ROOT, str(args.against): args.against.resolve()}
    later: dict[str, list[float]] = {"bare": [], **{name: [] for name in trees}}
    print(f"later steps, median ms ({args.steps} timed steps a run; `record` for each tree)\n")
    print("| round | " + " | ".join(later) + " |")
    print("| --- |" + " ---: |" * len(later))
    for round_ in range(1, args.rounds + 1):
        order = list(trees.items()) if round_ % 2 else list(reversed(trees.items()))
        with tempfile.TemporaryDirectory(prefix="bench-launches-", dir=os.environ.get("BENCH_DIR")) as tmp:
            runs = {"bare": run_child("bare", Path(tmp) / "bare", args)}
            runs.update({name: run_child("record", Path(tmp) / f"record{n}", args, tree)
                         for n, (name, tree) in enumerate(order)})
        cells = {}
        for name, result in runs.items():
            if "error" in result:
                cells[name] = f"failed: {result['error']}"
                continue
            later[name].append(statistics.median(result["steps"][1:] or result["steps"]))
            cells[name] = f"{later[name][-1] * 1e3:.1f}"
        print(f"| {round_} | " + " | ".join(cells[name] for name in later) + " |", flush=True)
    medians = [f"{statistics.median(times) * 1e3:.1f}" if times else "?" for times in later.values()]
    print("| median | " + " | ".join(medians) + " |")


def add_shape(parser: argparse.ArgumentParser) -> None:
    """--shape: the block's sizes (the Liger block at 2048 tokens, hidden 4096, unless given)."""
    parser.add_argument("--shape", nargs=5, type=int, metavar=("TOKENS", "HIDDEN", "HEADS", "FFN", "VOCAB"),
                        default=[2048, 4096, 32, 11008, 32000])


def load_block(shape: list[int]) -> Any:
    sys.argv = [str(BLOCK), *map(str, shape)]  # block.py reads its shapes from its command line
    spec = importlib.util.spec_from_file_location("liger_block", BLOCK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_inputs(block: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The block's weights, its batch, targets and RoPE tables: the same every run (seed 0), in the
    order block.step takes them."""
    import torch

    gen = torch.Generator().manual_seed(0)
    weights, (cos, sin) = block.weights(gen), block.rope_tables()
    x = torch.randn(1, block.TOKENS, block.HIDDEN, generator=gen).to(block.DEVICE, block.DTYPE)
    target_ids = torch.randint(0, block.VOCAB, (block.TOKENS,), generator=gen).to(block.DEVICE)
    return weights, x, target_ids, cos, sin


def timed_step(shape: list[int]) -> Callable[[], float]:
    """One step of the block at `shape` (loaded, its inputs made once), run and timed: milliseconds
    from the device idle to the device done (diagnostic scripts time steps this way)."""
    import torch

    block = load_block(shape)
    inputs = step_inputs(block)
    sync: Callable[[], None] = torch.cuda.synchronize if block.DEVICE == "cuda" else (lambda: None)

    def step() -> float:
        sync()
        started = time.perf_counter()
        block.step(*inputs)
        sync()
        return (time.perf_counter() - started) * 1e3
    return step


def prepare(mode: str, target: Path) -> None:
    """What must be on before the warm-up step compiles the kernels: tritonparse attaches its launch
    metadata (tensor blobs included) to a kernel when it compiles, so it starts here, and its files
    hold the warm-up step's launches too."""
    if mode.startswith("tritonparse"):
        import tritonparse.structured_logging as tritonparse

        target.mkdir(parents=True)
        tritonparse.init(str(target), enable_trace_launch=True, enable_tensor_blob_storage=mode.endswith("blobs"))


@contextlib.contextmanager
def running(mode: str, target: Path) -> Iterator[Any]:
    if mode in ("door", "record"):
        import replay

        only = ("kernel-replay-bench-keeps-no-kernel",) if mode == "door" else ()
        with replay.recording(target, only=only) as recording:
            yield recording
    else:  # bare, or tritonparse (on since prepare)
        yield None


def run_mode(mode: str, shape: list[int], steps: int, target: Path) -> dict[str, Any]:
    import torch

    import replay  # noqa: F401 (without a GPU: Triton's interpreter, before Liger imports triton; else nothing)

    block = load_block(shape)
    cuda = block.DEVICE == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    weights, x, target_ids, cos, sin = step_inputs(block)
    prepare(mode, target)
    block.step(weights, x, target_ids, cos, sin)  # compiles every kernel, outside any recording
    sync()
    times = []
    started = time.perf_counter()
    with running(mode, target) as recording:
        for step in range(steps):
            sync()
            step_started = time.perf_counter()
            block.step(weights, x, target_ids, cos, sin)
            sync()
            times.append(time.perf_counter() - step_started)
            if step == 0:
                if recording is not None:
                    recording.flush()
                first_written = time.perf_counter() - step_started
                first_bytes = sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) if target.exists() else 0
        program = time.perf_counter() - started
    closed = time.perf_counter() - started
    files = [f for f in target.rglob("*") if f.is_file()] if target.exists() else []
    launches = None
    if mode == "record":
        from replay.snapshot import Snapshot

        launches = len(Snapshot(target)) / steps
    elif mode.startswith("tritonparse"):
        launches = traced_launches(target) / (steps + 1)  # the warm-up step traced too
    return {"steps": times, "first_written_s": first_written, "first_bytes": first_bytes,
            "program_s": program, "closed_s": closed, "bytes": sum(f.stat().st_size for f in files),
            "files": len(files), "launches_per_step": launches,
            "device": torch.cuda.get_device_name() if cuda else "cpu"}


def traced_launches(target: Path) -> int:
    """The launch events tritonparse's trace holds (what it captured, counted rather than assumed)."""
    count = 0
    for log in target.rglob("*.ndjson"):
        with open(log) as lines:
            count += sum(json.loads(line).get("event_type") == "launch" for line in lines if line.strip())
    return count


def captured_launches(result: dict[str, Any]) -> str:
    seen = result.get("launches_per_step")
    return f"; {seen:.1f} launches a step" if seen is not None else ""


def bandwidth_floors(directory: Path) -> dict[str, float]:
    """Pinned device-to-host and disk-write GB/s, measured as scripts/bench_capture.py does."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_capture import d2h_gbps, disk_gbps

    floors = {"disk": disk_gbps(directory, nbytes=256 << 20)}
    if torch.cuda.is_available():
        floors["d2h"] = d2h_gbps(256 << 20)
    return floors


def print_table(results: dict[str, dict[str, Any]], args: argparse.Namespace, floors: dict[str, float]) -> None:
    bare = results.get("bare", {})
    bare_later = statistics.median(bare["steps"][1:] or bare["steps"]) if "steps" in bare else None
    launches = results.get("record", {}).get("launches_per_step")  # the program's launches a step
    device = next((r["device"] for r in results.values() if "device" in r), "?")
    print(f"{device}; shape {' '.join(map(str, args.shape))}; {args.steps} timed steps; launches a step: "
          f"{launches if launches is not None else '?'}; disk {floors['disk']:.2f} GB/s"
          + (f", pinned D2H {floors['d2h']:.1f} GB/s" if "d2h" in floors else "") + "\n")
    print("| mode | first step ms (x bare) | first step written ms | later steps ms, median (x bare) "
          "| extra us a launch, later steps | closed s | bytes written (files) | captured |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for mode, result in results.items():
        if "error" in result:
            print(f"| {mode} | failed: {result['error']} | | | | | | |")
            continue
        first, later = result["steps"][0], statistics.median(result["steps"][1:] or result["steps"])
        ratio = (lambda t: f" ({t / bare_later:.2f}x)") if bare_later else (lambda t: "")
        extra = f"{(later - bare_later) / launches * 1e6:.1f}" if bare_later and launches else "?"
        print(f"| {mode} | {first * 1e3:.1f}{ratio(first)} | {result['first_written_s'] * 1e3:.1f} "
              f"| {later * 1e3:.1f}{ratio(later)} | {extra} | {result['closed_s']:.2f} "
              f"| {result['bytes'] / 1e6:.1f} MB ({result['files']}) | {CAPTURED[mode]}{captured_launches(result)} |")
    record = results.get("record", {})
    if "bytes" in record and bare_later:
        first_bytes = record["first_bytes"]
        later_bytes = (record["bytes"] - first_bytes) / max(args.steps - 1, 1)
        bounds = {"bare": bare_later, "disk": first_bytes / (floors["disk"] * 1e9)}
        if "d2h" in floors:
            bounds["D2H"] = first_bytes / (floors["d2h"] * 1e9)
        bound = 1.25 * max(bounds.values())
        print(f"\nrecord: the first step's {first_bytes / 1e6:.1f} MB, floors: "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in bounds.items())
              + f"; the bound 1.25x the largest: {bound * 1e3:.1f} ms, written in "
              f"{record['first_written_s'] / bound:.2f}x it; later steps {later_bytes / 1e6:.1f} MB a step")


def print_cold(cold: dict[str, Any]) -> None:
    """The one-step recording that compiled the recorder's own kernels before the table's runs."""
    if "error" in cold:
        print(f"\nthe recording that compiled the recorder's kernels failed: {cold['error']}")
        return
    print(f"\nbefore these runs, a one-step recording compiled the recorder's own kernels (once per machine: "
          f"Triton's cache): its step took {cold['steps'][0] * 1e3:.1f} ms, its {cold['first_bytes'] / 1e6:.1f} MB "
          f"written in {cold['first_written_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
