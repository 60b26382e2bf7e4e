"""`replay repro`: one recorded call as a directory anyone can run with torch and safetensors.

The directory holds the call's arguments and the outputs expected of it (`call.safetensors`, each
tensor the storage span of its view, rebuilt with its strides), what to call and how
(`call.json`), the kernel's package as this code has it (`code/`), a stand-in for kernel-replay's
registration API where that package imports it (`code/replay/`, from repro_shim.py), and the
script (`repro.py`, from repro_script.py). What is expected: the op's reference run here on the
recorded inputs, within the op's tolerance; for a recorded Triton launch with no reference, what
the recording stored after it, bit for bit (or within --atol/--rtol).
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from replay.code import KernelCode, package_source
from replay.compare import compare
from replay.engine.runner import run_variant
from replay.engine.session import CannotMake, ReplayOptions, op_for
from replay.errors import CallUntestable, ReplayError
from replay.registry import REFERENCE, SINGLE
from replay.snapshot import CallRecord, Snapshot
from replay.snapshot.tensors import geometry_of, storage_span

HERE = Path(__file__).resolve().parent
_IMPORTS_REPLAY = re.compile(r"^\s*(import replay\b|from replay(\.[\w.]+)? import )", re.MULTILINE)


class NotReproducible(ReplayError):
    """A call `replay repro` cannot write as a standalone script (bad input: exit 2)."""


@dataclass
class Repro:
    directory: Path
    describe: str
    against: str  # "reference" or "recorded"
    agrees_here: dict[str, bool] = field(default_factory=dict)  # per output, as kernel-replay ran it

    @property
    def passed(self) -> bool:
        return all(self.agrees_here.values())


def make_repro(path: str | Path, index: int, out: Path, options: ReplayOptions) -> Repro:
    snapshot = Snapshot(path)
    record = snapshot.load(index)
    where = f"{path}: call {index}"
    if record.torch_op is not None:
        raise NotReproducible(f"{where} is a PyTorch operator call ({record.op}): run it with torch itself")
    if record.triton is not None and record.triton.get("generated"):
        raise NotReproducible(f"{where}: kernel {record.op} was generated at run time (torch.compile's): no module "
                              "to import")
    try:
        op = op_for(KernelCode(options.code_dir, options.providers), record, snapshot, options)
    except CannotMake as exc:
        raise CallUntestable(f"{where}: {exc}") from None
    inputs = record.arguments()
    run = run_variant(op, op.variants[record.variant], inputs, options.device)
    if run.error:
        raise CallUntestable(f"{where}: {record.variant} failed here: {run.error}")
    reference = op.variants.get(REFERENCE) if record.variant != REFERENCE else None
    if reference is not None:
        oracle = run_variant(op, reference, inputs, options.device)
        if oracle.error:
            raise CallUntestable(f"{where}: the reference failed here: {oracle.error}")
        expected = dict(oracle.outputs)
        tolerances = {name: op.tolerance_for(t.dtype) for name, t in expected.items()}
    else:
        expected = {name: record.tensors[f"out/{name}"] for name in record.role("out")}
        tolerances = {name: op.rerun_tolerance_for(t.dtype) for name, t in expected.items()}
    call = _describe(record, op, run.outputs, where)
    call["expected"] = {name: {"tolerance": None if t is None or (t.atol == 0 and t.rtol == 0 and record.triton)
                               else [t.atol, t.rtol]} for name, t in tolerances.items()}
    call["describe"] = f"call {index} ({record.op}, {record.variant}) of {Path(path).name}"
    result = Repro(out, call["describe"], "reference" if reference is not None else "recorded")
    for name, want in expected.items():
        got = run.outputs.get(name)
        result.agrees_here[name] = got is not None and compare(got, want, tolerances[name], same_dtype=False).passed
    _write(out, call, record, expected, str(call["module"]), force_shim=call["kind"] == "op")
    return result


def _describe(record: CallRecord, op: Any, outputs: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    """What repro.py calls: the kernel launched as recorded, or the variant's function as written."""
    args = [dict(a) for a in record.args]
    if record.triton is not None:
        launch = record.triton
        options = {**launch.get("options", {}), **(launch.get("config_args") or {})}
        return {"kind": "triton", "module": record.provider, "qualname": launch["qualname"], "args": args,
                "grid": list(launch.get("grid") or []), "options": options, "dtypes": launch.get("dtypes", {}),
                "outputs": list(record.role("out"))}
    fn = op.variants[record.variant].fn
    if op.provider == "__main__":
        raise NotReproducible(f"{where}: op {record.op} is declared in the script that was run, not in a module")
    if record.variant == SINGLE and (op.rows(record.arguments()) or 1) > 1:
        raise NotReproducible(f"{where}: the single variant ran it row by row over {op.rows(record.arguments())} "
                              "rows; repro makes one call: choose a call of one row, or its batched twin")
    called = {"names": list(op.outputs), "mutates": [n for n in op.mutates if n in outputs], "args": args}
    if _found(fn):  # reached by its name: the module need not know kernel-replay
        return {"kind": "function", "module": fn.__module__, "qualname": fn.__qualname__, **called}
    # made in a factory, say: found through the registration the stand-in keeps
    return {"kind": "op", "module": op.provider, "op": record.op, "variant": record.variant, **called}


def _found(fn: Any) -> bool:
    found: Any = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is fn or getattr(found, "__wrapped__", None) is fn


def _write(out: Path, call: dict[str, Any], record: CallRecord, expected: dict[str, torch.Tensor],
           module: str, force_shim: bool) -> None:
    if out.exists() and any(out.iterdir()):
        raise NotReproducible(f"{out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    tensors, geometry = {}, {}
    for key in {a["tensor"] for a in record.args if "tensor" in a}:
        t = record.tensors[key]
        g = geometry_of(t)
        tensors[key] = storage_span(t, g).contiguous()
        geometry[key] = g.to_json()
    for name, t in expected.items():
        flat = t.detach().cpu().contiguous()
        tensors[f"expected/{name}"] = flat.flatten()
        geometry[f"expected/{name}"] = {**geometry_of(flat).to_json(), "storage_offset": 0}
    call["tensors"] = geometry
    save_file({k: v.cpu() for k, v in tensors.items()}, str(out / "call.safetensors"))
    (out / "call.json").write_text(json.dumps(call, indent=1) + "\n")
    shutil.copyfile(HERE / "repro_script.py", out / "repro.py")
    _copy_package(module, out / "code", force_shim)


def _copy_package(module: str, code: Path, force_shim: bool) -> None:
    """The top-level package (or module) `module` belongs to, as imported here, into `code/`; the
    stand-in for kernel-replay's API beside it where its source imports `replay`."""
    top = module.partition(".")[0]
    source = package_source(module)
    if source is None:
        raise NotReproducible(f"module {module}: its source is not on disk here")
    code.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, code / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        texts = [p.read_text(errors="replace") for p in (code / top).rglob("*.py")]
    else:
        shutil.copyfile(source, code / source.name)
        texts = [source.read_text(errors="replace")]
    if force_shim or any(_IMPORTS_REPLAY.search(t) for t in texts):
        (code / "replay").mkdir()
        shutil.copyfile(HERE / "repro_shim.py", code / "replay" / "__init__.py")
