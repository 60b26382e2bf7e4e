"""Reproduce one recorded kernel call with torch, safetensors and the kernel's own code only.

Written by `replay repro` next to `call.json` (what to call, how, and what to expect),
`call.safetensors` (the arguments and the expected outputs, each as the storage span of its view)
and `code/` (the kernel's package as it was given to `replay repro`). Runs the call on the GPU when
there is one (else the CPU, Triton through its interpreter), compares what it made with what was
expected, prints a line per output and exits 0 when all agree, 1 when one differs.
No part of kernel-replay is needed: where the kernel's module was written against kernel-replay's
registration API, `code/replay/` stands in for it.

    python repro.py            # the call as recorded
    python repro.py --code DIR # another version of the kernel's package, put first on the path
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def decode(value: Any) -> Any:
    """A recorded JSON argument: {"$float": "nan"} and {"$tuple": [...]} made again."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$float"}:
            return float(value["$float"])
        if set(value) == {"$tuple"}:
            return tuple(decode(v) for v in value["$tuple"])
        return {k: decode(v) for k, v in value.items()}
    return value


def rebuild(span: Any, geometry: dict[str, Any], device: str) -> Any:
    """The recorded view over its stored span: same shape, strides and storage offset."""
    import torch

    offset = geometry["storage_offset"]
    base = torch.zeros(offset + span.numel(), dtype=span.dtype, device=device)
    base[offset:] = span.to(device)
    return torch.as_strided(base, geometry["shape"], geometry["stride"], offset)


def named(result: Any, names: list[str]) -> dict[str, Any]:
    """What the call returned, by output name: a dict as it is; a tuple by the op's declared names
    when they fit, else out0, out1, ...; one value `out` (kernel-replay's own rule)."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    values = result if isinstance(result, (tuple, list)) else (result,)
    default = ["out"] if len(values) == 1 else [f"out{i}" for i in range(len(values))]
    return dict(zip(names if len(names) == len(values) else default, values))


def find(module: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        module = getattr(module, part)
    return module


def agree(actual: Any, expected: Any, tolerance: list[float] | None) -> tuple[bool, str]:
    import torch

    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if actual.shape != expected.shape:
        return False, f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    if tolerance is None:
        same = actual.dtype == expected.dtype and torch.equal(actual.reshape(-1).view(torch.uint8),
                                                              expected.reshape(-1).view(torch.uint8))
        return same, "bitwise equal" if same else "bits differ"
    a, e = actual.double(), expected.double()
    close = torch.isclose(a, e, rtol=tolerance[1], atol=tolerance[0], equal_nan=True)
    worst = float((a - e).abs().nan_to_num(math.inf).max()) if a.numel() else 0.0
    wrong = int((~close).sum())
    return wrong == 0, f"{wrong} of {a.numel()} elements beyond atol {tolerance[0]:g} rtol {tolerance[1]:g}; " \
                       f"max |diff| {worst:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, help="the kernel's package from DIR instead of code/")
    given = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    sys.path.insert(0, str(HERE / "code"))
    if given.code is not None:
        sys.path.insert(0, str(given.code.resolve()))
    from safetensors.torch import load_file

    call = json.loads((HERE / "call.json").read_text())
    stored = load_file(str(HERE / "call.safetensors"))
    tensors = {key: rebuild(stored[key], geometry, device) for key, geometry in call["tensors"].items()}
    args = {a["name"]: tensors[a["tensor"]] if "tensor" in a else decode(a["json"]) for a in call["args"]}
    module = importlib.import_module(call["module"])
    if call["kind"] == "op":  # a variant registered through the stand-in for kernel-replay's API
        target = sys.modules["replay"]._OPS[call["op"]].variants[call["variant"]]
    else:
        target = find(module, call["qualname"])
    if call["kind"] == "triton":
        while not hasattr(target, "run") or type(target).__name__ in ("Autotuner", "Heuristics"):
            target = target.fn  # the kernel inside autotune and heuristics wrappers
        if call["dtypes"]:
            import triton.language as tl
            args.update({name: tl.dtype(text) for name, text in call["dtypes"].items()})
        target[tuple(call["grid"])](**args, **call["options"])
        made = {name: args[name] for name in call["outputs"]}
    else:
        made = {name: value for name, value in named(target(**args), call["names"]).items() if hasattr(value, "shape")}
        made.update({name: args[name] for name in call["mutates"]})
    if device == "cuda":
        torch.cuda.synchronize()
    ok = True
    for name, expected in call["expected"].items():
        if name not in made:
            print(f"{name}: not made by the call")
            ok = False
            continue
        passed, how = agree(made[name], tensors[f"expected/{name}"], expected["tolerance"])
        ok &= passed
        print(f"{name}: {'agrees' if passed else 'DIFFERS'} ({how})")
    print(f"{call['describe']}: {'reproduced, no divergence' if ok else 'DIVERGES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
