"""Where each rank's snapshot goes and how a multi-rank recording is found again.

A process launched by torchrun (or anything setting RANK and WORLD_SIZE the same way) that
records into DIR records into DIR/rank-<r>/ instead: a snapshot of its own, valid alone, whose
manifest's `distributed` says the rank, the world size, the run id all ranks share and, once the
program has made its process group, the backend and the groups' ranks. DIR itself holds no
manifest: that is how a reader tells a multi-rank parent from a snapshot.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay import settings
from replay.compare import row_ranges
from replay.errors import SnapshotError
from replay.snapshot.reader import MAX_MANIFEST_BYTES, rank_snapshots
from replay.snapshot.writer import MANIFEST

MAX_RANKS = 1 << 16


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    run_id: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "run_id": self.run_id}


def rank_from_env(environ: dict[str, str] | None = None) -> RankInfo | None:
    """This process's rank as torchrun says it (RANK, WORLD_SIZE, LOCAL_RANK in `environ`, else
    this process's environment), or None for a process that is not one rank of several. The run
    id: REPLAY_RUN_ID (`replay record` sets it), else torchrun's TORCHELASTIC_RUN_ID, else the
    rendezvous address."""
    env = os.environ if environ is None else environ
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world < 2 or not 0 <= rank < world:
        return None
    run_id = (settings.RUN_ID.get() or env.get("TORCHELASTIC_RUN_ID")
              or f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}")
    try:
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        local = rank
    return RankInfo(rank, world, local, run_id)


def rank_path(parent: str | Path, rank: int) -> Path:
    return Path(parent) / f"rank-{rank}"


def is_multi_rank(path: str | Path) -> bool:
    """A directory holding no manifest but at least one rank-<r>/ snapshot."""
    path = Path(path)
    return not (path / MANIFEST).exists() and bool(rank_snapshots(path))


def snapshot_members(location: str | Path) -> dict[int | None, Path]:
    """The snapshots `location` holds: each rank's of a multi-rank recording, by rank (its problems are
    rank_set's), else `location` itself under None."""
    return dict(rank_set(location).ranks.items()) if is_multi_rank(location) else {None: Path(location)}


@dataclass(frozen=True)
class RankSet:
    """The rank snapshots of a multi-rank parent, in rank order, and what is wrong with the set."""

    parent: Path
    ranks: dict[int, Path]
    world_size: int
    run_id: str | None
    problems: tuple[str, ...]  # a rank missing: its snapshot was never written (a rank that died early)


def rank_set(parent: str | Path) -> RankSet:
    """Read the rank directories of `parent`; a mix of runs, or a rank whose manifest says
    another rank, is refused (SnapshotError)."""
    parent = Path(parent)
    if not is_multi_rank(parent):
        raise SnapshotError(f"{parent}: not a multi-rank recording (no rank-<r>/ snapshots in it)")
    ranks = rank_snapshots(parent)
    said: dict[int, dict[str, Any]] = {}
    for rank, child in ranks.items():
        said[rank] = _distributed(child)
        if said[rank].get("rank", rank) != rank:
            raise SnapshotError(f"{child}: its manifest says rank {said[rank].get('rank')}, its directory {rank}")
    run_ids = {str(d["run_id"]) if d.get("run_id") is not None else None for d in said.values()}
    if len(run_ids) > 1:
        raise SnapshotError(f"{parent}: its ranks come from different runs ({', '.join(sorted(map(str, run_ids)))}); "
                            "record into a new directory")
    worlds = {int(d["world_size"]) for d in said.values() if isinstance(d.get("world_size"), int)}
    if len(worlds) > 1:
        raise SnapshotError(f"{parent}: its ranks disagree on the world size ({sorted(worlds)})")
    world: int = worlds.pop() if worlds else max(ranks) + 1
    if not 0 < world <= MAX_RANKS or max(ranks) >= world:
        raise SnapshotError(f"{parent}: rank {max(ranks)} in a world of {world}")
    missing = [r for r in range(world) if r not in ranks]
    problems = (f"{parent}: rank(s) {row_ranges(missing)} of {world} recorded nothing "
                "(no rank-<r>/ snapshot)",) if missing else ()
    return RankSet(parent, ranks, world, run_ids.pop(), problems)


def _distributed(snapshot: Path) -> dict[str, Any]:
    """The manifest's `distributed` block (empty when the manifest has none or is unreadable: the
    reader says what is wrong with it when the rank is opened)."""
    try:
        with open(snapshot / MANIFEST, "rb") as f:
            manifest = json.loads(f.read(MAX_MANIFEST_BYTES))
    except (OSError, ValueError):
        return {}
    block = manifest.get("distributed") if isinstance(manifest, dict) else None
    return block if isinstance(block, dict) else {}
