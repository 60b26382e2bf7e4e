"""How long `replay ptx` takes on the whole kernel library for three targets: cold (an empty Triton
cache, so every kernel is compiled), warm (the same cache again), and the floor a run cannot go
below (starting Python and importing replay and the kernels); then, in this process with the cache
warm, the parse-and-analyse share alone.

    python scripts/bench_ptx.py [--arch sm_80,sm_89,sm_90] [--dtype bfloat16] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_run(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - started, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_80,sm_89,sm_90")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()

    cache = tempfile.mkdtemp(prefix="bench-ptx-cache-")
    env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "replay", "ptx", "--arch", options.arch, "--dtype", options.dtype,
               "--provider", "replay_kernels", "--json", "-"]
    cold, done = timed_run(command, env)
    if done.returncode not in (0, 1):
        sys.exit(f"replay ptx failed ({done.returncode}): {done.stderr.strip()}")
    report = json.loads(done.stdout)
    warm, _ = timed_run(command, env)
    floor, _ = timed_run([sys.executable, "-c", "import replay.cli, kernels"], env)

    # the analysis alone: parse and check the PTX the warm run compiles again, in this process
    os.environ["TRITON_CACHE_DIR"] = cache
    sys.path.insert(0, str(ROOT))
    import torch

    import replay_kernels  # noqa: F401 (registers the ops and their examples)
    from replay.device import use_interpreter_without_gpu
    from replay.ptx.analysis import check_sources
    from replay.ptx.sources import op_ptx
    from replay.code import KernelCode

    device = use_interpreter_without_gpu()
    archs = [int(a.removeprefix("sm_")) for a in options.arch.split(",")]
    sources = op_ptx(KernelCode(providers=["replay_kernels"]).ops([]), archs, getattr(torch, options.dtype), device)
    started = time.perf_counter()
    check_sources(sources)
    analysis = time.perf_counter() - started
    ptx_lines = sum(s.text.count("\n") for s in sources)

    figures = {"kernels_checked": len(report["kernels"]), "distinct_ptx": len({s.text for s in sources}),
               "ptx_lines_analysed": ptx_lines, "passed": report["passed"], "examples_device": device,
               "cpus": os.cpu_count(), "cold_s": cold, "warm_s": warm, "import_floor_s": floor,
               "analysis_s": analysis, "cold_over_warm": cold / warm, "warm_over_floor": warm / floor}
    print(f"| run | seconds | ratio |\n| --- | ---: | ---: |\n"
          f"| cold (empty Triton cache) | {cold:.1f} | {cold / floor:.1f}x the floor |\n"
          f"| warm (same cache) | {warm:.1f} | {warm / floor:.1f}x the floor |\n"
          f"| floor: start Python, import replay and kernels | {floor:.1f} | 1.0x |\n"
          f"| parse + analyse only ({ptx_lines} PTX lines, in process) | {analysis:.2f} | |")
    print(f"{figures['kernels_checked']} kernel reports ({figures['distinct_ptx']} distinct PTX) for "
          f"{options.arch}, examples on {device}, {os.cpu_count()} CPUs, passed: {report['passed']}")
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
