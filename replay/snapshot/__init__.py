"""The on-disk snapshot format (version 1). Knows nothing of ops; see docs/FORMAT.md."""
from replay.snapshot.manifest import FORMAT_VERSION
from replay.snapshot.reader import CallEntry, CallRecord, Snapshot
from replay.snapshot.writer import SnapshotWriter

__all__ = ["FORMAT_VERSION", "CallEntry", "CallRecord", "Snapshot", "SnapshotWriter"]
