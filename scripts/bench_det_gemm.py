"""det_gemm on a GPU: accuracy against fp64 and speed against cuBLAS (torch.matmul, bf16), forward
and backward, on the projection shapes of a 7B-class model; and the floor a fixed tile sets where M is
small.

    PYTHONPATH=. python3 scripts/bench_det_gemm.py [--sweep] [--quick]

Times are GPU time with a cold L2 (bench_kernels.bench_us: a call captured 20 times into a CUDA
graph behind a 128 MiB read, the read alone subtracted, median of 10 replays), for det_gemm and
cuBLAS alike. Backward is dx = dout @ W plus dW = dout.T @ x.

The floor: det_gemm runs one program per SM over cdiv(N, BLOCK_N) x cdiv(M, BLOCK_M) tiles, and a
fixed tile without split-K has few tiles at small M, so most SMs idle (4096 columns in 256-wide
tiles are 16 tiles for 132 SMs) and each busy one walks all of K alone. `floor` is the time of one
tile alone (det_gemm on BLOCK_M x BLOCK_N outputs) times the waves of tiles, cdiv(tiles, SMs):
what the fixed tile allows at that M. `W read` is one read of the weight's bytes with the whole
GPU, what any kernel needs.

--sweep times candidate tiles forward on every shape and M first, and reports the best fixed tile
(highest geometric mean of cuBLAS time / det_gemm time at M >= 1024, then over all M) instead of
the shipped one. With $OUT set, writes $OUT/bench_det_gemm.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import torch
import triton

from bench_kernels import bench_us, read_floor_us
from replay_kernels.det_gemm import GPU_TILE, Tile, error_bound, matmul

SHAPES = ((4096, 4096), (4096, 12288), (4096, 11008), (11008, 4096), (4096, 32000))  # (in K, out N)
MS = (1, 16, 128, 1024, 2048)
CANDIDATES = (Tile(128, 256, 64, 8, 3, 8), Tile(128, 256, 64, 8, 3, 4), Tile(128, 128, 64, 4, 4, 8),
              Tile(256, 128, 64, 8, 3, 8), Tile(64, 256, 64, 4, 4, 8))
BF16 = torch.bfloat16


@dataclass
class Point:
    k: int
    n: int
    m: int
    tiles: int
    tiles_per_sm: float
    det_us: float
    cublas_us: float
    speed: float  # cuBLAS time / det_gemm time: det_gemm's throughput as a fraction of cuBLAS's
    tflops: float
    floor_us: float  # waves of tiles x one tile's time
    weight_read_us: float
    bwd_det_us: float | None = None
    bwd_cublas_us: float | None = None
    bwd_speed: float | None = None
    err_over_bound: float | None = None  # max |det - fp64| / bound: at most 1
    rel_err: float | None = None  # ||det - fp64|| / ||fp64||
    cublas_rel_err: float | None = None


def one_tile_us(k: int, tile: Tile) -> float:
    """det_gemm on a problem of one tile (BLOCK_M x BLOCK_N outputs, K deep): one program walking K
    alone, the least any M costs while its tiles fit on the SMs at once."""
    x, weight = operands(tile.block_m, k, tile.block_n, seed=1)
    return bench_us(lambda: matmul(x, weight.t(), tile=tile))


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(BF16)
    weight = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(BF16)
    return x, weight


def accuracy(x: torch.Tensor, weight: torch.Tensor) -> tuple[float, float, float]:
    """(max |det - fp64| / error_bound, relative Frobenius error of det_gemm and of cuBLAS)."""
    want = x.double() @ weight.double().t()
    got = matmul(x, weight.t()).double()
    cublas = (x @ weight.t()).double()
    bound = error_bound(x, weight)
    return (float(((got - want).abs() / bound).max()), float((got - want).norm() / want.norm()),
            float((cublas - want).norm() / want.norm()))


_CUBLAS_US: dict[tuple[int, int, int], float] = {}


def cublas_us(x: torch.Tensor, wt: torch.Tensor) -> float:
    key = (x.shape[0], *wt.shape)
    if key not in _CUBLAS_US:
        _CUBLAS_US[key] = bench_us(lambda: torch.matmul(x, wt))
    return _CUBLAS_US[key]


def forward_speed(k: int, n: int, m: int, tile: Tile) -> float:
    """cuBLAS time / det_gemm time, forward."""
    x, weight = operands(m, k, n)
    return cublas_us(x, weight.t()) / bench_us(lambda: matmul(x, weight.t(), tile=tile))


def measure(k: int, n: int, m: int, tile: Tile) -> Point:
    x, weight = operands(m, k, n)
    wt = weight.t()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = triton.cdiv(n, tile.block_n) * triton.cdiv(m, tile.block_m)
    det_us = bench_us(lambda: matmul(x, wt, tile=tile))
    cublas = cublas_us(x, wt)
    point = Point(k, n, m, tiles, tiles / sms, det_us, cublas, cublas / det_us,
                  2 * m * n * k / det_us * 1e-6, triton.cdiv(tiles, sms) * one_tile_us(k, tile), read_floor_us(weight))
    grad = torch.randn(m, n, device="cuda").to(BF16)
    point.bwd_det_us = bench_us(lambda: (matmul(grad, weight, tile=tile), matmul(grad.t(), x, tile=tile)))
    point.bwd_cublas_us = bench_us(lambda: (torch.matmul(grad, weight), torch.matmul(grad.t(), x)))
    point.bwd_speed = point.bwd_cublas_us / point.bwd_det_us
    point.err_over_bound, point.rel_err, point.cublas_rel_err = accuracy(x, weight)
    return point


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def sweep(shapes: tuple, ms: tuple) -> list[dict]:
    results = []
    for tile in CANDIDATES:
        try:
            speeds = {(k, n, m): forward_speed(k, n, m, tile) for k, n in shapes for m in ms}
        except Exception as exc:  # a tile that does not fit (shared memory, registers) is reported, not fatal
            print(f"tile {tile}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        large = [speed for (_, _, m), speed in speeds.items() if m >= 1024]
        results.append({"tile": tile._asdict(), "geomean_large_m": geomean(large), "min_large_m": min(large),
                        "geomean_all": geomean(list(speeds.values())),
                        "speeds": {f"{k}x{n} M={m}": round(speed, 3) for (k, n, m), speed in speeds.items()}})
        print(f"tile {tuple(tile)}: x{results[-1]['geomean_large_m']:.3f} of cuBLAS at M>=1024 "
              f"(min x{results[-1]['min_large_m']:.3f}), x{results[-1]['geomean_all']:.3f} over all M", flush=True)
    results.sort(key=lambda r: (r["geomean_large_m"], r["geomean_all"]), reverse=True)
    return results


def table(points: list[Point], tile: Tile) -> str:
    lines = [f"det_gemm tile {tuple(tile)} (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GROUP_M) against cuBLAS bf16",
             f"{'K x N':>12} {'M':>5} {'tiles':>6} {'/SM':>5} {'det us':>8} {'cuBLAS':>8} {'speed':>6} "
             f"{'TFLOP/s':>7} {'floor':>8} {'W read':>7} {'bwd det':>8} {'bwd cuB':>8} {'bwd sp':>6} "
             f"{'err/bd':>6} {'rel err':>8} {'cuB rel':>8}"]
    for p in points:
        lines.append(f"{p.k:>5}x{p.n:<6} {p.m:>5} {p.tiles:>6} {p.tiles_per_sm:>5.2f} {p.det_us:>8.1f} {p.cublas_us:>8.1f} "
                     f"{p.speed:>6.2f} {p.tflops:>7.1f} {p.floor_us:>8.1f} {p.weight_read_us:>7.1f} "
                     f"{p.bwd_det_us:>8.1f} {p.bwd_cublas_us:>8.1f} {p.bwd_speed:>6.2f} {p.err_over_bound:>6.3f} "
                     f"{p.rel_err:>8.2e} {p.cublas_rel_err:>8.2e}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="time the candidate tiles first")
    parser.add_argument("--quick", action="store_true", help="two shapes, M = 1 and 2048")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_det_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes, ms = (SHAPES[:1] + SHAPES[-1:], (1, 2048)) if args.quick else (SHAPES, MS)
    report: dict = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                    "torch": torch.__version__, "triton": triton.__version__, "command": " ".join(sys.argv)}
    tile = GPU_TILE
    if args.sweep:
        report["sweep"] = sweep(shapes, ms)
        tile = Tile(**report["sweep"][0]["tile"])
        print(f"best fixed tile: {tuple(tile)}; shipped (kernels/det_gemm.GPU_TILE): {tuple(GPU_TILE)}")
    points = [measure(k, n, m, tile) for k, n in shapes for m in ms]
    report["tile"], report["points"] = tile._asdict(), [asdict(p) for p in points]
    large = [p for p in points if p.m >= 1024]
    report["target_met"] = all(p.speed >= 0.8 for p in large)
    report["accurate"] = all(p.err_over_bound <= 1 for p in points)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_det_gemm.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(table(points, tile))
    print(f"M >= 1024 at >= 0.8x cuBLAS on every shape: {report['target_met']} "
          f"(min forward x{min(p.speed for p in large):.2f}, backward x{min(p.bwd_speed for p in large):.2f}); "
          f"every point within the error bound: {report['accurate']}")
    return 0 if report["accurate"] else 1


if __name__ == "__main__":
    sys.exit(main())
