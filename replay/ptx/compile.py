"""Compiling recorded Triton launches to PTX for CUDA targets, with no GPU.

A launch record that carries `module`, `signature` and the constexpr values (kernels/launch.py
records them) says how to compile that kernel again: `triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", arch, 32), options={"num_warps": ...})`. Its
`specialisations` say what Triton's launch specialised on besides the types: an int argument
equal to 1 compiled in as a constant, an int divisible by 16 or a pointer aligned to 16 bytes
known so (what lets Triton vectorise loads), each as the kernel's own parameter allows
(`do_not_specialize`): without them the PTX would be another binary than the one that ran. That
runs in child processes with the Triton interpreter off (a process that chose the interpreter has no
compilable kernels), the jobs dealt out over the cores; the modules they import must be
trusted (replay/trust.py). Triton's own cache (TRITON_CACHE_DIR) makes a second run fast.

    python -c "from replay.ptx.compile import main; main()" < jobs.json > results.json
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping

from replay.errors import ReplayError
from replay.ptx import cubin


_OPTIONS = ("num_warps", "num_stages")  # launch options that change the compiled code


@dataclass(frozen=True)
class CompileJob:
    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    arch: int
    options: tuple[tuple[str, int], ...] = ()
    dtypes: tuple[str, ...] = ()  # the constexprs that are Triton dtypes, given by name ("fp16")
    specialisations: tuple[tuple[str, str], ...] = ()  # runtime parameter -> "1" or "D" (specialisation)

    @classmethod
    def from_launch(cls, launch: Mapping[str, Any], arch: int) -> CompileJob | None:
        """The job for a launch record, or None when it does not say how to compile it."""
        signature = launch.get("signature")
        if not isinstance(signature, dict) or not isinstance(launch.get("module"), str) or \
                not isinstance(launch.get("kernel"), str) or not all(isinstance(k, str) for k in signature.values()):
            return None
        nested = launch.get("constexprs")  # a recorded Triton launch's (launch_record.py); else at the top level
        values = nested if isinstance(nested, dict) else launch
        names = [name for name, kind in signature.items() if kind == "constexpr"]
        if any(name not in values for name in names):
            return None  # a value the record does not hold (replay.launch keeps no float's): not compiled
        constexprs = tuple((name, values[name]) for name in names)
        if not all(value is None or isinstance(value, (bool, int, float, str)) for _, value in constexprs):
            return None  # a value a recording could not have compiled with: not a record this reads
        options = tuple((name, launch[name]) for name in _OPTIONS if isinstance(launch.get(name), int))
        dtypes = launch.get("dtypes", [])
        if not isinstance(dtypes, list) or not all(isinstance(value, str) for name, value in constexprs
                                                   if name in dtypes):
            return None
        given = launch.get("specialisations")
        specialisations = tuple((name, key) for name, key in given.items()
                                if signature.get(name) not in (None, "constexpr") and key in ("1", "D")) \
            if isinstance(given, dict) else ()  # a hint: what no launch could have specialised on is left out
        return cls(launch["module"], str(launch["kernel"]), tuple(signature.items()), constexprs, arch, options,
                   tuple(name for name, _ in constexprs if name in dtypes), specialisations)

    @property
    def entry(self) -> str:
        """The kernel's name in PTX: its function's own (`Kernels.rope` is `rope` there)."""
        return self.kernel.rpartition(".")[2]

    def param_names(self) -> list[str]:
        """The kernel's runtime arguments in order: PTX calls them <kernel>_param_0, _param_1, ..."""
        return [name for name, kind in self.signature if kind != "constexpr"]


@dataclass(frozen=True)
class Compiled:
    ptx: str
    registers: int | None  # per thread, from the cubin
    stack: int | None  # bytes of local memory (spills, local arrays) a thread, from the cubin
    shared: int | None  # bytes of shared memory a program uses
    error: str | None = None  # why the kernel did not compile ("module.kernel for sm_90: ..."); nothing else is set
    # the kernel's runtime parameters in PTX order (<kernel>_param_<i>): an argument specialised as
    # the constant 1 is none
    params: tuple[str, ...] = ()


def compile_jobs(jobs: list[CompileJob], timeout: float | None = None, workers: int | None = None) -> list[Compiled]:
    """Each job compiled, in child processes (at most `workers`, default one a core). A kernel that
    does not compile is a Compiled with its `error`, the others compiled all the same; a ReplayError
    only where a child process itself fails. A GEMV configuration takes seconds on a CPU core."""
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    shares = [jobs[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda share: _compile_in_child(share, timeout), shares))
    by_job = {job: result for share, done in zip(shares, results) for job, result in zip(share, done)}
    return [by_job[job] for job in jobs]


def _compile_in_child(jobs: list[CompileJob], timeout: float | None) -> list[Compiled]:
    payload = json.dumps([{"module": j.module, "kernel": j.kernel, "signature": dict(j.signature),
                           "constexprs": dict(j.constexprs), "arch": j.arch, "options": dict(j.options),
                           "dtypes": list(j.dtypes), "specialisations": dict(j.specialisations)} for j in jobs])
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": os.environ.get(
        "TRITON_DEFAULT_FP_FUSION", "1"), "PYTHONPATH": os.pathsep.join(sys.path)}
    # -c, with its working directory taken off the path: only what the parent resolved is imported
    worker = "import sys; del sys.path[0]; from replay.ptx.compile import main; main()"
    try:
        done = subprocess.run([sys.executable, "-c", worker], input=payload, capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ReplayError(f"compiling {len(jobs)} kernel(s) for PTX took more than {timeout:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ReplayError(f"compiling {len(jobs)} kernel(s) for PTX failed: {tail}")
    return [Compiled("", None, None, None, f"{job.module}.{job.kernel} for sm_{job.arch}: {r['error']}")
            if "error" in r else Compiled(r["ptx"], r["registers"], r["stack"], r["shared"], params=tuple(r["params"]))
            for job, r in zip(jobs, json.loads(done.stdout))]


def _compile(job: dict[str, Any]) -> dict[str, str]:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        from replay.triton_launches.kernels import unwrap

        fn = importlib.import_module(job["module"])
        for part in job["kernel"].split("."):  # a kernel on a class: its qualified name, walked
            fn = getattr(fn, part)
        fn = unwrap(fn)  # inside autotune, heuristics
        constexprs = {name: tl.dtype(value) if name in job.get("dtypes", ()) else value
                      for name, value in job["constexprs"].items()}
        signature, attrs = _specialised(fn, dict(job["signature"]), constexprs, job.get("specialisations", {}))
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", job["arch"], 32), options=job["options"])
        binary = compiled.asm.get("cubin", b"")
        return {"ptx": compiled.asm["ptx"], "registers": cubin.registers(binary), "stack": cubin.stack_bytes(binary),
                "shared": getattr(compiled.metadata, "shared", None),
                "params": [name for name, kind in signature.items() if kind != "constexpr"]}
    except Exception as exc:  # the kernel's own compile error, reported against it
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:500]}


def _specialised(fn: Any, signature: dict[str, str], constexprs: dict[str, Any],
                 specialisations: dict[str, str]) -> tuple[dict[str, str], dict[tuple[int, ...], Any]]:
    """The signature and attributes Triton's launch would have compiled `fn` with, given what its
    arguments were ("1": an int equal to 1, "D": an int divisible by 16 or a pointer aligned to 16),
    as each parameter allows (JITFunction.run's rules, triton/runtime/jit.py): `do_not_specialize`
    none of it, `do_not_specialize_on_alignment` no "D"; a parameter annotated with a type
    (`n: tl.int64`) is launched as that type and never as the constant 1, a float or bool one is
    never specialised. `constexprs` gains the arguments compiled in as 1."""
    from triton.backends.compiler import BaseBackend

    attrs: dict[tuple[int, ...], Any] = {}
    for param in getattr(fn, "params", ()):
        annotated = getattr(param, "annotation_type", None)
        annotated = annotated if isinstance(annotated, str) and annotated else None
        if annotated is not None and signature.get(param.name) not in (None, "constexpr"):
            signature[param.name] = annotated
        key = specialisations.get(param.name)
        if key is None or getattr(param, "do_not_specialize", False):
            continue
        if annotated is not None and (key == "1" or annotated == "u1" or annotated[:2] in ("fp", "bf")):
            continue
        if key == "1":
            signature[param.name] = "constexpr"
            constexprs[param.name] = 1
        elif key == "D" and not getattr(param, "do_not_specialize_on_alignment", False):
            attrs[(param.num,)] = BaseBackend.parse_attr("D")
    return signature, attrs


def main() -> None:
    print(json.dumps([_compile(job) for job in json.loads(sys.stdin.read())]))


if __name__ == "__main__":
    main()
