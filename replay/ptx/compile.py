"""Compiling recorded Triton launches to PTX for CUDA targets, with no GPU.

A launch record that carries `module`, `signature` and the constexpr values (kernels/launch.py
records them) says how to compile that kernel again: `triton.compile(ASTSource(fn, signature,
constexprs), target=GPUTarget("cuda", arch, 32))`. That runs in a child process with the
Triton interpreter off (a process that chose the interpreter has no compilable kernels), one
child for all launches; the modules it imports must be trusted (replay/trust.py).

    python -c "from replay.ptx.compile import main; main()" < jobs.json > results.json
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from replay.errors import ReplayError


@dataclass(frozen=True)
class CompileJob:
    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    arch: int

    @classmethod
    def from_launch(cls, launch: dict[str, Any], arch: int) -> CompileJob | None:
        """The job for a launch record, or None when it does not say how to compile it."""
        signature = launch.get("signature")
        if not isinstance(signature, dict) or not isinstance(launch.get("module"), str):
            return None
        constexprs = tuple((name, launch.get(name)) for name, kind in signature.items() if kind == "constexpr")
        return cls(launch["module"], str(launch["kernel"]), tuple(signature.items()), constexprs, arch)

    def param_names(self) -> list[str]:
        """The kernel's runtime arguments in order: PTX calls them <kernel>_param_0, _param_1, ..."""
        return [name for name, kind in self.signature if kind != "constexpr"]


def compile_jobs(jobs: list[CompileJob], timeout: float | None = None) -> list[str]:
    """PTX text for each job, compiled in one child process; a ReplayError names the first failure.

    Sequential: the GEMV's configurations take 10-20 s each on a CPU core, so a whole snapshot's
    kernels for three targets take minutes."""
    payload = json.dumps([{"module": j.module, "kernel": j.kernel, "signature": dict(j.signature),
                           "constexprs": dict(j.constexprs), "arch": j.arch} for j in jobs])
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
    results = json.loads(done.stdout)
    for job, result in zip(jobs, results):
        if "error" in result:
            raise ReplayError(f"{job.module}.{job.kernel} for sm_{job.arch}: {result['error']}")
    return [result["ptx"] for result in results]


def _compile(job: dict[str, Any]) -> dict[str, str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        fn = getattr(importlib.import_module(job["module"]), job["kernel"])
        source = ASTSource(fn=fn, signature=job["signature"], constexprs=job["constexprs"])
        return {"ptx": triton.compile(source, target=GPUTarget("cuda", job["arch"], 32)).asm["ptx"]}
    except Exception as exc:  # the kernel's own compile error, reported against it
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:500]}


def main() -> None:
    print(json.dumps([_compile(job) for job in json.loads(sys.stdin.read())]))


if __name__ == "__main__":
    main()
