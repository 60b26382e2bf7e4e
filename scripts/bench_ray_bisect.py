"""A Ray bisect over the machine's GPUs against the same bisect on one GPU (issue 37).

Builds `replay demo`'s kernel history (a planted bug among its commits), records the tiny model's
prefill at v1.2 on the GPU, then bisects it to the planted commit three ways, each with
--no-cache, in one run: the local pool on one GPU (--jobs 1), the local pool over every GPU
(--jobs G, a probe a GPU) and a local Ray over every GPU (--executor ray --jobs G: a Ray task a
probe, one GPU each). Prints rounds, probes, wall time and the answer of each as a Markdown table.

    PYTHONPATH=. python3 scripts/bench_ray_bisect.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from replay.bisect import write_history
from replay.demo import BUG_AT, GOOD_TAG, kernel_history, kernel_sources, record_snapshot


def bisect(repo: Path, snapshot: Path, jobs: int, extra: list[str], env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "replay", "bisect", "--good", GOOD_TAG, "--bad", "HEAD", str(snapshot),
               "--repo", str(repo), "--jobs", str(jobs), "--no-cache", *extra, "--json", "-"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if not done.stdout.startswith("{"):
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout), "wall": wall, "exit": done.returncode}


def main() -> None:
    gpus = torch.cuda.device_count()
    root = Path(tempfile.mkdtemp(prefix="bench-ray-bisect-"))
    repo = root / "kernel-history"
    shas = write_history(repo, kernel_history(kernel_sources()))
    subprocess.run(["git", "tag", GOOD_TAG, shas[0]], cwd=repo, check=True)
    checkout = root / "at-good"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(checkout), GOOD_TAG], cwd=repo, check=True)
    snapshot = root / "prefill_001"
    record_snapshot(checkout, snapshot)
    subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=repo, check=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    one_gpu = {**env, "CUDA_VISIBLE_DEVICES": "0"}
    runs = [("local pool, 1 GPU", bisect(repo, snapshot, 1, [], one_gpu)),
            (f"local pool, {gpus} GPUs", bisect(repo, snapshot, gpus, [], env)),
            (f"Ray (local), {gpus} GPUs", bisect(repo, snapshot, gpus, ["--executor", "ray"], env))]
    print(f"\n`replay demo`'s history: {len(shas)} commits, the planted bug at {shas[BUG_AT][:10]}; "
          f"{torch.cuda.get_device_name()} x {gpus}\n")
    print("| bisect | jobs | rounds | probes | wall s | first bad | exit |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for label, result in runs:
        first = (result.get("first_bad") or {}).get("sha", "")[:10]
        print(f"| {label} | {1 if '1 GPU' in label else gpus} | {result['rounds']} | {result['probes_run']} "
              f"| {result['wall']:.1f} | {first} {'(planted)' if first == shas[BUG_AT][:10] else ''} "
              f"| {result['exit']} |")
    devices = {p["device"] for p in runs[2][1]["probes"]}
    print(f"\nRay probes' devices as reported: {sorted(map(str, devices))}")


if __name__ == "__main__":
    main()
