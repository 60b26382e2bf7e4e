"""How long `replay kv-check`'s default check takes on the tiny model, and where the time goes: the
runs alone (the model's own work, the baseline), the same runs recorded, and the checks on the
recording.

    python scripts/bench_kv_check.py [--prompt-len 8] [--chunks 1,4,N] [--decode-steps 4] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import replay_kernels  # noqa: F401 (registers the ops; the interpreter without a GPU)
from replay_kernels.kv_adapter import tiny
from replay.device import use_interpreter_without_gpu
from replay.kv.caches import check_snapshot
from replay.kv.runs import RunPlan, parse_chunks, record_runs, run_once, runs_of
from replay.snapshot import Snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--chunks", default="1,4,N")
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--device", default=None)
    options = parser.parse_args()
    device = options.device or use_interpreter_without_gpu()
    plan = RunPlan(options.prompt_len, parse_chunks(options.chunks), options.decode_steps)

    adapter = tiny(device)
    tokens = plan.tokens(adapter.vocab)
    run_once(adapter, tokens, plan.prompt_len, plan.chunks[-1])  # warm: Triton compiles on a GPU's first call
    started = time.perf_counter()
    for _, chunk in runs_of(plan):  # the same runs, nothing recorded: the model's own cost
        run_once(adapter, tokens, plan.prompt_len, chunk)
    bare = time.perf_counter() - started

    out = Path(tempfile.mkdtemp(prefix="bench-kv-")) / "runs"
    started = time.perf_counter()
    record_runs(tiny, device, plan, out)
    recorded = time.perf_counter() - started
    started = time.perf_counter()
    report = check_snapshot(Snapshot(out))
    checked = time.perf_counter() - started
    calls = len(Snapshot(out).entries)
    print(f"| phase | seconds | ratio to the bare runs |\n| --- | ---: | ---: |\n"
          f"| the runs, nothing recorded | {bare:.1f} | 1.00x |\n"
          f"| the runs, recorded ({calls} calls) | {recorded:.1f} | {recorded / bare:.2f}x |\n"
          f"| the checks on the recording | {checked:.1f} | {checked / bare:.2f}x |\n"
          f"| kv-check in all | {recorded + checked:.1f} | {(recorded + checked) / bare:.2f}x |")
    print(f"device {device}; runs {', '.join(report.runs)}; passed: {report.passed}")


if __name__ == "__main__":
    main()
