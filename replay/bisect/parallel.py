"""Probing commits up to `jobs` at a time, each in its own worktree, through the cache.

A probe runs as a child process of this one (LocalProbes), or as a Ray task (ray_probes.py);
either way the rounds, the cache and the progress are the Prober's, here.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Protocol

import git

from replay.bisect.cache import ProbeCache
from replay.bisect.probe import ProbeCommand, ProbeOutcome, ProbeRunner
from replay.bisect.ray_probes import RayProbes
from replay.bisect.result import ProbeRecord
from replay.bisect.search import SKIP
from replay.bisect.steps import Step, StepHandler
from replay.bisect.worktrees import Worktrees


def visible_gpus(jobs: int) -> list[str]:
    """The GPU ids probes may use: CUDA_VISIBLE_DEVICES if set, else torch's count.

    torch is only asked when probes run in parallel (its import is slow), and a
    machine without torch or CUDA simply has none.
    """
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if jobs < 2:
        return []
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch, or a broken CUDA install: probes run without pinning
        return []


def device_for(slot: int, gpus: list[str]) -> str | None:
    """The CUDA_VISIBLE_DEVICES of the probe in `slot` of a round; None leaves it alone."""
    return gpus[slot % len(gpus)] if len(gpus) > 1 else None


class ProbeBackend(Protocol):
    """Where one probe of a commit runs; called from the Prober's threads."""

    def run(self, command: ProbeCommand, sha: str, device: str | None) -> ProbeOutcome: ...

    def cancel(self) -> None:
        """Stop every probe running and refuse new ones (Ctrl-C, SIGTERM)."""

    def close(self) -> None: ...


class LocalProbes:
    """Each probe a child process of this one, in a worktree of its own."""

    def __init__(self, worktrees: Worktrees, timeout: float | None) -> None:
        self._worktrees = worktrees
        self._runner = ProbeRunner(timeout, worktrees.neutral_dir)

    def run(self, command: ProbeCommand, sha: str, device: str | None) -> ProbeOutcome:
        with self._worktrees.checkout(sha) as worktree:
            return self._runner.run(command, worktree, sha, device)

    def cancel(self) -> None:
        self._runner.cancel()

    def close(self) -> None:
        pass


class Prober:
    """Probes commits, up to `jobs` at a time, each in its own worktree; reuses and fills the cache.

    executor `local` runs each probe here, one GPU each; `ray` runs it as a Ray task on the cluster
    at `ray_address` (else a local Ray), its files found per `ship` (replay/ray_cluster.py).
    """

    def __init__(self, repo: git.Repo, cache: ProbeCache, emit: StepHandler, jobs: int,
                 timeout: float | None, reuse_cache: bool, executor: str = "local", ray_address: str | None = None,
                 ship: str = "auto") -> None:
        self.records: list[ProbeRecord] = []
        self._reuse = reuse_cache
        self._cache = cache
        self._emit = emit
        self._gpus = visible_gpus(jobs) if executor == "local" else []  # Ray gives each task its GPU
        self._worktrees = Worktrees(repo)
        self.scratch = self._worktrees.root / "scratch"  # files probes leave for the bisect (gone on close)
        self.scratch.mkdir()
        try:
            self._backend = self._backend_for(executor, repo, jobs, timeout, ray_address, ship)
        except BaseException:  # no Ray to connect to: the worktrees' root goes all the same
            self._worktrees.close()
            raise
        self._executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="replay-probe")

    def _backend_for(self, executor: str, repo: git.Repo, jobs: int, timeout: float | None,
                      ray_address: str | None, ship: str) -> ProbeBackend:
        if executor == "ray":  # Ray is imported only now, as RayProbes connects
            return RayProbes(repo, self._worktrees, timeout, jobs, ray_address, ship, self._emit)
        return LocalProbes(self._worktrees, timeout)

    def cached(self, sha: str, command: ProbeCommand) -> ProbeOutcome | None:
        return self._cache.get(sha, command.identity) if self._reuse else None

    def record_for(self, sha: str, command: ProbeCommand) -> ProbeRecord | None:
        return next((r for r in self.records if r.sha == sha and r.command == command.label), None)

    def probe(self, shas: list[str], purpose: str, round_: int, command: ProbeCommand) -> dict[str, ProbeRecord]:
        """Each commit's record under `command`: from the cache, else from probes run in parallel."""
        return self.probe_each({sha: command for sha in shas}, purpose, round_)

    def probe_each(self, commands: dict[str, ProbeCommand], purpose: str, round_: int,
                   fresh: frozenset[str] = frozenset()) -> dict[str, ProbeRecord]:
        """Each commit under its own command, in parallel; the commits in `fresh` are probed again
        whatever the cache knows (their probe leaves files the bisect reads)."""
        done: dict[str, ProbeRecord] = {}
        to_run = []
        for sha, command in commands.items():
            outcome = None if sha in fresh else self.cached(sha, command)
            if outcome is None:
                to_run.append(sha)
            else:
                done[sha] = self._keep(ProbeRecord(sha, purpose, round_, True, None, command.label, outcome))
        futures = {}
        for slot, sha in enumerate(to_run):
            device = device_for(slot, self._gpus)
            where = f" on GPU {device}" if device is not None else ""
            message = f"probing {sha[:10]} ({purpose}{f', round {round_}' if round_ else ''}){where}"
            futures[self._executor.submit(self._probe_one, commands[sha], sha, device, message)] = (sha, device)
        for future in as_completed(futures):
            sha, device = futures[future]
            outcome = future.result()
            self._cache.put(sha, commands[sha].identity, outcome)
            done[sha] = self._keep(ProbeRecord(sha, purpose, round_, False, device, commands[sha].label, outcome))
        return done

    def _probe_one(self, command: ProbeCommand, sha: str, device: str | None, message: str) -> ProbeOutcome:
        self._emit(Step("probe", message))  # from the worker, so the log shows when it really starts
        try:
            return self._backend.run(command, sha, device)
        except git.GitCommandError as exc:  # e.g. a disk full: skip the commit, keep bisecting
            lines = str(exc.stderr).strip().splitlines()
            return ProbeOutcome(SKIP, None, f"checkout failed: {lines[-1] if lines else exc}", 0.0, None, "")

    def _keep(self, record: ProbeRecord) -> ProbeRecord:
        self.records.append(record)
        o = record.outcome
        how = "cached" if record.cached else f"{o.seconds:.2f} s"
        self._emit(Step("result", f"{record.sha[:10]} {o.verdict} ({o.reason}, {how})", detail=o.output_tail,
                        data=record.to_json()))
        return record

    def close(self) -> None:
        self._backend.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)
        try:
            self._backend.close()
        finally:
            self._worktrees.close()
