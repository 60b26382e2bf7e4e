"""Regenerate the committed snapshots (snapshots/prefill_001) from the tiny model.

    python scripts/make_snapshots.py            # CPU: Triton interpreter

The snapshot is a batched prefill of the kernel model (8 tokens, seed 0): every op
call of both layers, with tags, state and launch records.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from replay.device import use_interpreter_without_gpu

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "snapshots" / "prefill_001")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    use_interpreter_without_gpu()
    from kernels.model import record_prefill

    shutil.rmtree(args.out, ignore_errors=True)
    path = record_prefill(args.out, prompt_len=args.prompt_len, seed=args.seed)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"wrote {path}: {len(list((path / 'calls').iterdir()))} calls, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
