"""Where PTX comes from: files from any compiler, the kernels a snapshot ran, or the kernels an op's
variants launch on its registered examples; the last two compiled again for each CUDA target."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from replay.context import collecting
from replay.errors import RegistryError, ReplayError
from replay.kernel_rules import KernelRules
from replay.ptx.compile import CompileJob, compile_jobs
from replay.code import KernelCode
from replay.registry import REFERENCE, SINGLE, Op, get_op
from replay.snapshot import Snapshot
from replay.triton_launches.launch_record import launch_record

BATCH_ROWS = 5  # rows a batched variant's example gets: more than one program's worth in every kernel here


@dataclass
class PtxSource:
    """One kernel's PTX and what is known of the launch it came from."""

    where: str
    text: str
    param_names: dict[str, str] = field(default_factory=dict)  # PTX parameter -> kernel argument
    binds: dict[str, str] = field(default_factory=dict)  # kernel argument -> the call's argument
    op: str | None = None
    variant: str | None = None
    example: str | None = None  # the op example (code path) that launched it
    arch: int | None = None
    grid: list[int] | None = None
    path: str | None = None  # the launch's recorded path ("direct", "indirect")
    given: frozenset[str] = frozenset()  # the call's arguments that were not None
    rules: KernelRules | None = None
    constexprs: dict[str, Any] = field(default_factory=dict)
    registers: int | None = None
    stack: int | None = None  # bytes of local memory a thread (spills), from the cubin
    shared: int | None = None
    error: str | None = None  # the kernel did not compile (compile.Compiled.error): `text` is empty
    kernel: str | None = None  # the kernel's name in PTX, where it did not compile (its PTX would say it)


@dataclass
class _Launch:
    """A launch to compile for each target, and where it came from."""

    record: Mapping[str, Any]
    where: str
    op: Op | None
    variant: str
    given: frozenset[str]
    example: str | None = None


def file_ptx(path: Path, rules: KernelRules | None = None, variant: str | None = None) -> PtxSource:
    """A PTX file; `rules` and `variant` say what its kernels are, when the user does."""
    try:
        return PtxSource(str(path), path.read_text(), rules=rules, variant=variant)
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: unreadable: {getattr(exc, 'strerror', None) or exc}") from None


def snapshot_ptx(path: Path, archs: Iterable[int], providers: Iterable[str] = (),
                 code_dir: Path | None = None) -> list[PtxSource]:
    """Each distinct kernel launch of the snapshot at `path`, compiled for each target; the kernels'
    modules must be trusted. The op's rules apply where its (trusted) provider declares it."""
    snapshot = Snapshot(path)
    code = KernelCode(code_dir, providers)  # the compiling children import from the same path
    launches = []
    for entry in snapshot.entries:
        call = snapshot.load(entry)
        op = _registered(entry.op, call.provider, code)
        where = f"{path}: call {entry.index} ({entry.op} {entry.variant})"
        given = frozenset(a["name"] for a in call.args if "tensor" in a or a.get("json") is not None)
        records = call.launch if call.triton is None else [launch_record(call)]
        for record in records:
            if isinstance(record.get("module"), str):
                code.trust.check(record["module"], f"{path}: call {entry.index}")
            launches.append(_Launch(record, where, op, entry.variant, given))
    found = _compiled(launches, list(archs))
    if not found:
        raise ReplayError(f"{path}: no launch record says how to compile its kernel (module and signature: "
                          "record with kernels/launch.py's run, or pass record_launch(module=, signature=); "
                          "a Triton launch `replay record` made says it, unless its kernel was generated, or "
                          "defined in the program's own script: move it into a module the script imports)")
    return found


def op_ptx(ops: Iterable[Op], archs: Iterable[int], dtype: torch.dtype, device: str) -> list[PtxSource]:
    """The kernels each op's variants but the reference launch on each of its examples (one row for
    single, BATCH_ROWS for the others, `dtype` on `device`; variants that cannot run there are left
    out), compiled for each target."""
    launches = []
    for op in ops:
        if not op.examples:
            raise ReplayError(f"op '{op.name}' registers no example (Op.example), so its kernels cannot be found "
                              "without a recording: use replay ptx --snapshot DIR")
        for example, make in op.examples.items():
            for variant in (name for name, v in op.variants.items() if name != REFERENCE and device in v.backends):
                arguments = _example_arguments(op, variant, example, make, dtype, device)
                given = frozenset(name for name, value in arguments.items() if value is not None)
                for record in _launches_of(op, variant, example, arguments):
                    launches.append(_Launch(record, f"{op.name} {variant} [{example}]", op, variant, given, example))
    found = _compiled(launches, list(archs))
    if not found:
        raise ReplayError(f"ops {', '.join(op.name for op in ops)}: their variants launched no kernel that "
                          "says how to compile it (module and signature: kernels/launch.py's run records them)")
    return found


def _example_arguments(op: Op, variant: str, example: str, make: Any, dtype: torch.dtype,
                       device: str) -> dict[str, Any]:
    try:
        return make(1 if variant == SINGLE else BATCH_ROWS, dtype, device)
    except Exception as exc:  # the provider's example failing, said in one line
        raise _failed(op, variant, example, "building its arguments", exc) from None


def _launches_of(op: Op, variant: str, example: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        with collecting(0, arguments) as sink:
            op.get(variant).fn(**arguments)
    except ReplayError:
        raise
    except Exception as exc:  # the code under test failing is a finding about it, said in one line
        raise _failed(op, variant, example, "running", exc) from None
    return sink.launches


def _failed(op: Op, variant: str, example: str, doing: str, exc: Exception) -> ReplayError:
    return ReplayError(f"op '{op.name}' {variant}, example '{example}': {doing} failed: {type(exc).__name__}: "
                       f"{' '.join(str(exc).split())[:300]}")


def _registered(name: str, provider: str | None, code: KernelCode) -> Op | None:
    """The op `name` if its provider may be imported and declares it; its rules then apply."""
    if provider is None or not code.trust.allows(provider):
        return None
    code.import_provider(provider, name)  # a trusted provider that fails to import is an error, not "no rules"
    try:
        return get_op(name)
    except RegistryError:
        return None


def _compiled(launches: list[_Launch], archs: list[int]) -> list[PtxSource]:
    """Every launch that says how to compile it, for each target; each distinct job compiled once."""
    pending, seen = [], set()
    for launch in launches:  # a prefill launches the same kernel in every layer: one row for them all
        for arch in archs:
            job = CompileJob.from_launch(launch.record, arch)
            binds = launch.record.get("binds")
            key = (job, launch.op and launch.op.name, launch.variant, launch.example, str(launch.record.get("path")),
                   tuple(sorted((str(k), str(v)) for k, v in binds.items())) if isinstance(binds, dict) else ())
            if job is not None and key not in seen:
                seen.add(key)
                pending.append((launch, job))
    jobs = list(dict.fromkeys(job for _, job in pending))
    results = dict(zip(jobs, compile_jobs(jobs))) if jobs else {}
    sources = []
    for launch, job in pending:
        compiled, record = results[job], launch.record
        names = {f"{job.entry}_param_{i}": name for i, name in enumerate(compiled.params)}
        binds = given if isinstance(given := record.get("binds"), dict) else {}
        grid = record.get("grid") if isinstance(record.get("grid"), list) else None
        path = record.get("path") if isinstance(record.get("path"), str) else None
        sources.append(PtxSource(launch.where, compiled.ptx, names, binds,
                                 launch.op.name if launch.op else None, launch.variant, launch.example, job.arch,
                                 grid, path, launch.given, launch.op.kernel_rules if launch.op else None,
                                 dict(job.constexprs), compiled.registers, compiled.stack, compiled.shared,
                                 compiled.error, job.entry if compiled.error else None))
    return sources
