"""The PTX of the kernels a snapshot ran: its launch records compiled again for each target."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable

from replay.errors import ReplayError
from replay.ptx.compile import CompileJob, compile_jobs
from replay.snapshot import Snapshot
from replay.trust import ProviderTrust


def snapshot_ptx(path: Path, archs: Iterable[int], providers: Iterable[str] = (),
                 code_dir: Path | None = None) -> list[tuple[str, str, dict[str, str]]]:
    """(where, PTX text, PTX parameter name -> argument name) for each distinct kernel launch of the
    snapshot at `path` and each target; the kernels' modules must be trusted."""
    snapshot = Snapshot(path)
    trust = ProviderTrust.of(providers, code_dir)
    jobs: dict[CompileJob, str] = {}
    for entry in snapshot.entries:
        for launch in snapshot.load(entry).launch:
            for arch in archs:
                job = CompileJob.from_launch(launch, arch)
                if job is not None and job not in jobs:
                    trust.check(job.module, f"{path}: call {entry.index}")
                    jobs[job] = f"{path}: call {entry.index} ({entry.op}), {job.kernel} for sm_{arch}"
    if not jobs:
        raise ReplayError(f"{path}: no launch record says how to compile its kernel (module and signature: "
                          "record with kernels/launch.py's run, or pass record_launch(module=, signature=))")
    if code_dir is not None and str(code_dir.resolve()) not in sys.path:
        sys.path.insert(0, str(code_dir.resolve()))  # the compiling child imports from the same places
    texts = compile_jobs(list(jobs))
    return [(where, text, {f"{job.kernel}_param_{i}": name for i, name in enumerate(job.param_names())})
            for (job, where), text in zip(jobs.items(), texts)]


def file_ptx(path: Path) -> tuple[str, str, dict[str, str]]:
    """(where, PTX text, no renames) of a PTX file."""
    try:
        return str(path), path.read_text(), {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: unreadable: {getattr(exc, 'strerror', None) or exc}") from None
