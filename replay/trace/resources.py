"""Registers, shared memory and stack of launches recorded without them (the interpreter reports
none): each kernel compiled again for a CUDA target with no GPU, as `replay ptx` does, and marked so.
Triton's cache keeps the compiled kernels, so a second trace is fast."""
from __future__ import annotations

from typing import Iterable

from replay.ptx.compile import CompileJob, compile_jobs
from replay.trace.timeline import TimelineCall
from replay.trust import ProviderTrust


def fill_resources(calls: Iterable[TimelineCall], arch: int, trust: ProviderTrust) -> list[str]:
    """Give each launch without `registers` the figures of its kernel compiled for `arch` (one whose
    kernel did not compile is left without them, its `resources_from` saying why); returns why
    kernels did not compile, each reason once. The kernels' modules must be trusted."""
    pending = []
    for call in calls:
        for launch in call.launches:
            job = CompileJob.from_launch(launch, arch) if launch.get("registers") is None else None
            if job is not None:
                trust.check(job.module, f"call {call.index}")
                pending.append((launch, job))
    jobs = list(dict.fromkeys(job for _, job in pending))
    compiled = dict(zip(jobs, compile_jobs(jobs))) if jobs else {}
    for launch, job in pending:
        result = compiled[job]
        launch.update(registers=result.registers, shared=result.shared, stack=result.stack,
                      resources_from=f"did not compile: {result.error}" if result.error
                      else f"compiled for sm_{arch} (no GPU)")
    return list(dict.fromkeys(result.error for result in compiled.values() if result.error))
