"""Regenerate the committed snapshots (snapshots/prefill_001) from the tiny model.

    python scripts/make_snapshots.py            # CPU: Triton interpreter

The snapshot is a batched prefill of the kernel model (8 tokens, seed 0): every op
call of both layers, with tags, state and launch records. Its recorded outputs are the
golden data `replay run --golden-data` checks bit for bit, so run this on the CPU (the
platform CI tests on) after committing a kernel change, then commit the snapshot: the
manifest then names that commit, clean, and golden runs at HEAD have nothing to warn about.
It records into a new directory beside the old snapshot and swaps it in when complete.
"""
from __future__ import annotations

import argparse
import json
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
    from replay_kernels.model import record_prefill

    fresh = args.out.with_name(args.out.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    # recorded while the old snapshot is still in place: its tracked files do not make the tree look dirty
    record_prefill(fresh, prompt_len=args.prompt_len, seed=args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    fresh.rename(args.out)
    git = json.loads((args.out / "manifest.json").read_text())["producer"]["git"] or {}
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.out}: {len(list((args.out / 'calls').iterdir()))} calls, {size / 1e6:.2f} MB; "
          f"recorded at commit {git.get('commit')}{' with uncommitted changes' if git.get('dirty') else ''}")


if __name__ == "__main__":
    main()
