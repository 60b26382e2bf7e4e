"""Benchmark the kernels on a GPU against the best PyTorch expression of each op and against
the memory-bandwidth floor (bytes moved / device-to-device copy bandwidth measured here).

    PYTHONPATH=. python3 scripts/bench_kernels.py [--sweep] [--quick] [--only rows|gemv] [--jobs N]

Times are GPU time only: each call is captured into a CUDA graph 20 times, each time after
reading 128 MiB (evicting the 50 MB L2, so weights come from HBM); the same graph without the
call is subtracted. Median of 10 replays. No host launch overhead is counted, for kernels and
PyTorch alike. The flush reads rather than writes: after a memset the L2 is full of dirty lines,
and every line a kernel then reads first writes one back (a bare read of 9-33 MB took 5-16%
longer), which a decode step, whose L2 holds the last kernels' weights, never pays.

For each GEMV weight it also times two floors: one read of its bytes, and a read the way the
single-vector GEMV walks them (the same loads, none of the math).

Prints a table; with $OUT set, writes $OUT/bench_kernels.json. --sweep also times the GEMV tile
candidates; --only times just the row ops or just the GEMVs; --jobs N first compiles every GEMV
kernel the run will time in N processes (Triton caches them on disk).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import triton
import triton.language as tl

import replay_kernels  # noqa: F401  (registers every op)
from replay_kernels import ggml_quant
from replay_kernels.ggml_quant import QK_K, Q4_K, Q6_K, QuantFormat, columns_of
from replay_kernels.kquant.matmul import BATCHED_BLOCK_M, TILE_CANDIDATES, kquant_matmul, tile_config
from replay_kernels.kquant.walk import _load_step, _row_offsets
from replay_kernels.rope import rope_tables
from replay.registry import get_op

BF16 = torch.bfloat16
BANDWIDTH_TARGET = {"rmsnorm": 0.80, "residual_add": 0.80, "swiglu": 0.80, "rope": 0.80}
GEMV_BANDWIDTH_TARGET = 0.60
GEMV_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (N, K): rows of W, columns of W
GEMV_ROWS = (1, 2, 4, 8)


@dataclass
class Row:
    op: str
    shape: str
    kernel_us: float
    bytes: int
    fraction_of_copy: float
    torch_us: float | None = None
    torch_expr: str = ""
    target: str = ""
    met: bool | None = None
    notes: dict = field(default_factory=dict)


_FLUSH = None
REPS, REPLAYS = 20, 10


def _graph(fn: Callable[[], object] | None) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            _FLUSH.sum()
            if fn is not None:
                fn()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench_us(fn: Callable[[], object]) -> float:
    """GPU microseconds of one fn() with a cold L2 (see the module docstring)."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.zeros(32 << 20, dtype=torch.float32, device="cuda")  # 128 MiB
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with_fn, flush_only = _graph(fn), _graph(None)
    us = (_replay_ms(with_fn) - _replay_ms(flush_only)) / REPS * 1e3
    del with_fn, flush_only
    return us


def copy_bandwidth() -> dict[str, float]:
    """Bytes per second (read + write) of a 1 GiB device-to-device copy, two ways.

    Inside a CUDA graph a tensor copy becomes a memcpy node, which can run on the copy
    engines; an elementwise kernel copies with the SMs as the kernels here do. The floor
    is the faster of the two.
    """
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()
    return {"memcpy": moved / (bench_us(lambda: dst.copy_(src)) * 1e-6),
            "kernel": moved / (bench_us(lambda: torch.mul(src, 1.0, out=dst)) * 1e-6)}


def best_torch(candidates: dict[str, Callable[[], object]], notes: dict) -> tuple[float | None, str]:
    """Fastest of the PyTorch expressions; each is timed, failures (torch.compile's too) noted."""
    best: tuple[float | None, str] = (None, "")
    for name, fn in candidates.items():
        try:
            us = bench_us(fn)
        except Exception as exc:
            notes[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        notes[name + "_us"] = round(us, 2)
        if best[0] is None or us < best[0]:
            best = (us, name)
    return best


# ----------------------------------------------------------------------------- row ops

def rmsnorm_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).to(x.dtype)


def swiglu_torch(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.silu(g.float()) * u.float()).to(g.dtype)


def rope_torch(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    x1, x2 = x[..., : x.shape[-1] // 2].float(), x[..., x.shape[-1] // 2:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


def row_op_benches(quick: bool) -> list[tuple[str, str, Callable, dict[str, Callable], int]]:
    """(op, shape, kernel call, torch expressions, bytes moved) for each row op."""
    m = 4096 if quick else 8192
    x, r, w = (torch.randn(m, 8192, dtype=BF16, device="cuda") for _ in range(3))
    w = w[0].contiguous()
    g, u = (torch.randn(m // 2, 14336, dtype=BF16, device="cuda") for _ in range(2))
    t = m * 2
    q = torch.randn(t, 32, 128, dtype=BF16, device="cuda")
    cos, sin = rope_tables(t, 128, device="cuda")
    pos = torch.randperm(t, device="cuda").to(torch.int32)
    rms, add = get_op("rmsnorm").get("batched"), get_op("residual_add").get("batched")
    glu, rope = get_op("swiglu").get("batched"), get_op("rope").get("batched")
    eb = 2  # bf16
    rms_c, glu_c, rope_c = (torch.compile(f, dynamic=False) for f in (rmsnorm_torch, swiglu_torch, rope_torch))
    table_bytes = t * 64 * 4 * 2 + t * 4
    return [
        ("rmsnorm", f"{m}x8192 bf16", lambda: rms(x, w, 1e-5),
         {"eager": lambda: rmsnorm_torch(x, w), "torch.compile": lambda: rms_c(x, w)}, 2 * x.numel() * eb),
        ("residual_add", f"{m}x8192 bf16", lambda: add(x, r), {"eager": lambda: x + r}, 3 * x.numel() * eb),
        ("swiglu", f"{m // 2}x14336 bf16", lambda: glu(g, u),
         {"eager": lambda: swiglu_torch(g, u), "torch.compile": lambda: glu_c(g, u)}, 3 * g.numel() * eb),
        ("rope", f"{t}x32x128 bf16 neox", lambda: rope(q, pos, cos, sin, "neox"),
         {"eager": lambda: rope_torch(q, pos, cos, sin), "torch.compile": lambda: rope_c(q, pos, cos, sin)},
         2 * q.numel() * eb + table_bytes),
        ("rope", f"{t}x32x128 bf16 interleaved", lambda: rope(q, pos, cos, sin, "interleaved"), {},
         2 * q.numel() * eb + table_bytes),
    ]


# ----------------------------------------------------------------------------- GEMV

@triton.jit
def _read_words_kernel(src, out, n_words, BLOCK: tl.constexpr, LOADS: tl.constexpr):
    """Reads LOADS x BLOCK words a program, 16 bytes a load, all issued before any is used, and stores a
    sum a thread so that no load is dropped."""
    sums = tl.zeros([BLOCK // 4], dtype=tl.int32)
    for i in tl.static_range(LOADS):
        offs = (tl.program_id(0) * LOADS + i) * BLOCK + tl.arange(0, BLOCK)
        words = tl.load(src + offs, mask=offs < n_words, other=0)
        sums += tl.sum(tl.reshape(words, (BLOCK // 4, 4)), axis=1)
    tl.store(out + tl.program_id(0) * (BLOCK // 4) + tl.arange(0, BLOCK // 4), sums)


# a GEMV row's notes keys (and JSON fields) for its two floors
READ_NOTE, WALK_NOTE = "read the weight once_us", "read as the GEMV walks it_us"

# (words a load step, load steps, warps) of the read kernels read_floor_us tries: the fastest for the 9.4, 13.8
# and 33 MB weights in a sweep of 60 shapes on the H100, 2026-11-23 (the one shape used before was 5-6% slower)
READ_SHAPES = ((1024, 4, 4), (512, 16, 8), (256, 16, 2))


def read_floor_us(weight: torch.Tensor) -> float:
    """GPU microseconds of a kernel that only reads the weight's bytes once: what any GEMV over them costs at
    least (the fastest of READ_SHAPES). At a few tens of MB it stays well under copy bandwidth (launch,
    ramp-up and tail weigh in)."""
    words = weight.reshape(-1).view(torch.int32)
    times = []
    for block, loads, warps in READ_SHAPES:
        grid = triton.cdiv(words.numel(), block * loads)
        sums = torch.empty(grid * block // 4, dtype=torch.int32, device="cuda")
        times.append(bench_us(lambda: _read_words_kernel[(grid,)](words, sums, words.numel(), BLOCK=block,
                                                                  LOADS=loads, num_warps=warps)))
    return min(times)


@triton.jit
def _walk_words_kernel(w_ptr, out, n, nb, row_bytes, Q4K: tl.constexpr, BLOCK_N: tl.constexpr,
                       ROW_GROUPS: tl.constexpr, LANES: tl.constexpr):
    """Loads the weight's words exactly as the GEMV does (kernels/kquant/walk.py: the same tile, each step's
    words one step ahead behind the same fence) and only XORs them, so no load is dropped: the GEMV's access
    pattern without its math."""
    row_byte = _row_offsets(n, row_bytes, BLOCK_N, ROW_GROUPS)
    folded = tl.zeros([BLOCK_N // ROW_GROUPS, LANES], dtype=tl.int32)
    loaded = _load_step(w_ptr, row_byte, 0, nb, Q4K, LANES, ROW_GROUPS)
    for kb0 in tl.range(0, nb, LANES // 8):
        ahead = _load_step(w_ptr, row_byte, kb0 + LANES // 8, nb, Q4K, LANES, ROW_GROUPS)
        tl.debug_barrier()
        for g in tl.static_range(ROW_GROUPS):
            for word in tl.static_range(len(loaded[g])):
                folded ^= loaded[g][word].to(tl.int32)
        loaded = ahead
    tl.store(out + tl.program_id(0) * (BLOCK_N // ROW_GROUPS) * LANES
             + tl.arange(0, BLOCK_N // ROW_GROUPS)[:, None] * LANES + tl.arange(0, LANES)[None, :], folded)


def walk_floor_us(weight: torch.Tensor, fmt: QuantFormat) -> float:
    """GPU microseconds of reading the weight the way the single-vector GEMV walks it (same tile, same loads),
    with none of the math: how fast that kernel could be if its math cost nothing."""
    n, nb = weight.shape[0], columns_of(weight, fmt) // QK_K
    tile = tile_config(weight.device, fmt, n, nb, block_m=1)
    grid = triton.cdiv(n, tile.block_n)
    folded = torch.empty(grid * tile.block_n // tile.row_groups * tile.lanes, dtype=torch.int32, device="cuda")
    return bench_us(lambda: _walk_words_kernel[(grid,)](weight, folded, n, nb, weight.stride(0), Q4K=fmt == Q4_K,
                                                        BLOCK_N=tile.block_n, ROW_GROUPS=tile.row_groups,
                                                        LANES=tile.lanes, num_warps=tile.warps))


def random_blocks(fmt: QuantFormat, n: int, k: int) -> torch.Tensor:
    """Random quantised bytes with sane fp16 super-block scales (no NaN or inf)."""
    blocks = torch.randint(0, 256, (n, k // QK_K, fmt.block_bytes), dtype=torch.uint8, device="cuda")
    scale = torch.full((n, k // QK_K, 1), 1e-3, dtype=torch.float16, device="cuda").view(torch.uint8)
    fields = (0, 2) if fmt == Q4_K else (208,)
    for at in fields:
        blocks[..., at:at + 2] = scale
    return blocks.reshape(n, -1)


def gemv_benches(quick: bool, copy_bw: float) -> list[Row]:
    rows = []
    for fmt in (Q4_K, Q6_K):
        name = f"{fmt.name.lower().replace('_', '')}_gemv"
        single, batched = get_op(name).get("single"), get_op(name).get("batched")
        dequant = ggml_quant.DEQUANTIZERS[fmt.name]
        dequant_c = torch.compile(lambda w, dequant=dequant: dequant(w).to(BF16), dynamic=False)
        for n, k in GEMV_SHAPES[:2] if quick else GEMV_SHAPES:
            weight = random_blocks(fmt, n, k)
            dense = dequant(weight).to(BF16)
            read_us, walk_us = read_floor_us(weight), walk_floor_us(weight, fmt)
            for m in GEMV_ROWS:
                x = torch.randn(m, k, dtype=BF16, device="cuda") / 16
                call = (lambda: single(x, weight)) if m == 1 else (lambda: batched(x, weight))
                got, want = call().float(), (x @ dense.T).float()
                if (got - want).abs().max() > 2e-2 * want.abs().max():
                    raise SystemExit(f"{name} {n}x{k} M={m}: kernel disagrees with dequantise-then-matmul")
                row_notes: dict = {}
                candidates = {"eager dequant + matmul": lambda: x @ dequant(weight).to(BF16).T,
                              "compiled dequant + matmul": lambda: x @ dequant_c(weight).T}
                torch_us, expr = best_torch(candidates, row_notes)
                row_notes["dense bf16 matmul (weights already dequantised)_us"] = round(bench_us(lambda: x @ dense.T), 2)
                row_notes[READ_NOTE] = round(read_us, 2)
                row_notes[WALK_NOTE] = round(walk_us, 2)
                us = bench_us(call)
                moved = weight.numel() + x.numel() * 2 + m * n * 2
                frac = moved / (us * 1e-6) / copy_bw
                targets, met = [], []
                if m == 1 and (n, k) in GEMV_SHAPES[:2]:
                    targets.append(f">= {GEMV_BANDWIDTH_TARGET:.0%} copy bw")
                    met.append(frac >= GEMV_BANDWIDTH_TARGET)
                targets.append("faster than dequant+matmul")
                met.append(torch_us is not None and us < torch_us)
                rows.append(Row(name, f"M={m} N={n} K={k}", us, moved, frac, torch_us, expr, "; ".join(targets),
                                all(met), row_notes))
    return rows


def sweep_plan() -> list[tuple[QuantFormat, int, int, int, int, tuple | None]]:
    """(format, N, K, M, BLOCK_M, tile) of every sweep point: each candidate tile at M=1 (GEMV) and
    M=8 (batched), and the first tile with 8-row programs at M=8, on the target shapes."""
    plan = []
    for fmt in (Q4_K, Q6_K):
        for n, k in GEMV_SHAPES[:2]:
            plan += [(fmt, n, k, m, block_m, tile) for m, block_m in ((1, 1), (8, BATCHED_BLOCK_M))
                     for tile in TILE_CANDIDATES]
            plan.append((fmt, n, k, 8, 8, TILE_CANDIDATES[0]))
    return plan


def default_plan(quick: bool) -> list[tuple[QuantFormat, int, int, int, int, tuple | None]]:
    """The GEMV calls gemv_benches times, as sweep points (tile None: tile_config's)."""
    return [(fmt, n, k, m, 1 if m == 1 else BATCHED_BLOCK_M, None) for fmt in (Q4_K, Q6_K)
            for n, k in (GEMV_SHAPES[:2] if quick else GEMV_SHAPES) for m in GEMV_ROWS]


def _run_point(point: tuple) -> str:
    """One call of a plan point (compiling it, the first time); '' or what went wrong."""
    fmt, n, k, m, block_m, tile = point
    try:
        x = torch.randn(m, k, dtype=BF16, device="cuda")
        kquant_matmul(x, random_blocks(fmt, n, k), fmt, block_m=block_m, config=tile)
        torch.cuda.synchronize()
        return ""
    except Exception as exc:  # the timing run meets it again and reports it
        return f"{fmt.name} {point[1:]}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(plan: list[tuple], jobs: int) -> None:
    """Compile every kernel the plan will time in `jobs` processes; Triton's disk cache serves the timing run."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for problem in pool.imap_unordered(_run_point, plan):
            if problem:
                print(f"precompile: {problem}", file=sys.stderr, flush=True)


def sweep_gemv() -> list[dict]:
    """Times every sweep point, printing each as it goes."""
    results = []
    weights: dict[tuple, torch.Tensor] = {}
    for fmt, n, k, m, block_m, tile in sweep_plan():
        weight = weights.setdefault((fmt.name, n, k), random_blocks(fmt, n, k))
        x = torch.randn(m, k, dtype=BF16, device="cuda")
        try:
            us = bench_us(lambda: kquant_matmul(x, weight, fmt, block_m=block_m, config=tile))
        except Exception as exc:
            us = None
            print(f"sweep {fmt.name} {tile}: {type(exc).__name__}: {exc}", file=sys.stderr)
        results.append({"format": fmt.name, "N": n, "K": k, "M": m, "BLOCK_M": block_m, "config": tile, "us": us,
                        "weight_GBps": None if us is None else weight.numel() / us / 1e3})
        print(f"sweep {fmt.name} N={n} K={k} M={m} BLOCK_M={block_m} config={tuple(tile)}: "
              f"{us and round(us, 1)} µs", flush=True)
    return results


# ----------------------------------------------------------------------------- report

def table(rows: list[Row], copy_bw: float) -> str:
    lines = [f"copy bandwidth (1 GiB device-to-device, read+write, faster of memcpy and a copy kernel): "
             f"{copy_bw / 1e9:.0f} GB/s", "",
             "| op | shape | kernel µs | GB/s | % of copy bw | best PyTorch µs (expression) | kernel speedup | target | met |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    for r in rows:
        torch_col = f"{r.torch_us:.1f} ({r.torch_expr})" if r.torch_us else "-"
        speed = f"{r.torch_us / r.kernel_us:.2f}x" if r.torch_us else "-"
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        lines.append(f"| {r.op} | {r.shape} | {r.kernel_us:.1f} | {r.bytes / r.kernel_us / 1e3:.0f} | "
                     f"{r.fraction_of_copy:.0%} | {torch_col} | {speed} | {r.target or '-'} | {met} |")
    reads = [r for r in rows if READ_NOTE in r.notes]
    if reads:
        lines += ["", "| op | shape | kernel µs | read the weight once µs | read as the GEMV walks it µs | read / kernel |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in reads:
            read_us, walk_us = r.notes[READ_NOTE], r.notes[WALK_NOTE]
            lines.append(f"| {r.op} | {r.shape} | {r.kernel_us:.1f} | {read_us:.1f} | {walk_us:.1f} | "
                         f"{read_us / r.kernel_us:.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time GEMV tile configs")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer GEMV cases")
    parser.add_argument("--only", choices=("rows", "gemv"), help="time only the row ops or only the GEMVs")
    parser.add_argument("--jobs", type=int, default=0, help="first compile the GEMV kernels in N processes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA device", file=sys.stderr)
        return 2
    if args.jobs and args.only != "rows":
        precompile(default_plan(args.quick) + (sweep_plan() if args.sweep else []), args.jobs)
    torch.manual_seed(0)
    copies = copy_bandwidth()
    copy_bw = max(copies.values())
    rows = []
    for op, shape, call, candidates, moved in row_op_benches(args.quick) if args.only != "gemv" else ():
        notes: dict = {}
        torch_us, expr = best_torch(candidates, notes) if candidates else (None, "")
        us = bench_us(call)
        frac = moved / (us * 1e-6) / copy_bw
        target = BANDWIDTH_TARGET[op] if "interleaved" not in shape else None
        rows.append(Row(op, shape, us, moved, frac, torch_us, expr,
                        f">= {target:.0%} copy bw" if target else "", None if target is None else frac >= target,
                        notes))
    if args.only != "rows":
        rows += gemv_benches(args.quick, copy_bw)
    print(table(rows, copy_bw), flush=True)
    report = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "triton": triton.__version__, "command": " ".join(sys.argv),
              "copy_bandwidth_Bps": copy_bw, "copy_bandwidth_by_method_Bps": copies, "rows": [asdict(r) for r in rows]}
    if args.sweep and args.only != "rows":
        report["sweep"] = sweep_gemv()
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "bench_kernels.json"
        path.write_text(json.dumps(report, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
