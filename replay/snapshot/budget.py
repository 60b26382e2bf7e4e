"""What reading one call may cost in memory, so that a small hostile snapshot cannot blow it up.

The tensors a call's reading makes (blob copies, joined chunks) and the views it hands out may
each reach CALL_VIEW_RATIO times the distinct bytes the call stores on disk (its own bytes, and
each blob or chunk it names, once however often it is named), or settings.READ_LIMIT_MIB,
whichever is larger (raised for a large tensor stored as a few pieces: a KV cache still mostly zeros).
"""
from __future__ import annotations

from pathlib import Path

from replay import settings
from replay.errors import SnapshotError

CALL_VIEW_RATIO = 64


def read_limit_from_env() -> int:
    return settings.READ_LIMIT_MIB.get() << 20


class CallBudget:
    """One call's reading: what it makes, and what its views reach, each at most CALL_VIEW_RATIO
    times the distinct bytes it stores, or `floor`."""

    def __init__(self, path: Path, own_bytes: int, floor: int):
        self.path, self.floor = path, floor
        self.stored, self.made, self.viewed = own_bytes, 0, 0
        self._seen: set[str] = set()

    @property
    def limit(self) -> int:
        return max(CALL_VIEW_RATIO * self.stored, self.floor)

    def stores(self, digest: str, nbytes: int) -> None:
        """Blob `digest` is read for this call: its bytes count once, however often it is named."""
        if digest not in self._seen:
            self._seen.add(digest)
            self.stored += nbytes

    def spend(self, nbytes: int, what: str) -> None:
        """Memory about to be made for the call (`what` ends 'brings it to' or 'joins to')."""
        self.made += nbytes
        if self.made > self.limit:
            raise SnapshotError(f"{self.path}: {what} {self.made} bytes in memory, more than the {self.limit} its "
                                f"{self.stored} distinct stored bytes allow ({CALL_VIEW_RATIO} times, or "
                                f"REPLAY_READ_LIMIT_MIB); refused")

    def view(self, nbytes: int, key: str) -> None:
        self.viewed += nbytes
        if self.viewed > self.limit:
            raise SnapshotError(f"{self.path}: its views reach {self.viewed} bytes by tensor {key!r}, more than "
                                f"the {self.limit} its {self.stored} distinct stored bytes allow; refused")
