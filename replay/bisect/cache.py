"""Probe results kept per (commit, snapshot digest, command) in the repository's git dir.

A rerun, or a wider range, reuses every verdict already known. Only
deterministic outcomes are kept (exit 0, 1, 125); a timeout or an odd exit code is
retried next time. The file is rewritten atomically after every probe, so an
interrupted run keeps what it learnt.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from replay.bisect.probe import ProbeOutcome
from replay.snapshot.files import write_atomic
from replay.snapshot.writer import INDEX, MANIFEST

CACHE_NAME = "replay-bisect-cache.json"
CACHE_VERSION = 1
MAX_REPORT_CHARS = 64_000


def snapshot_digest(snapshot: Path | None) -> str:
    """sha256 of manifest.json and calls.jsonl: cheap, and complete, because every
    index line carries the sha256 of its call's files."""
    if snapshot is None:
        return "-"
    digest = hashlib.sha256()
    for name in (MANIFEST, INDEX):
        path = snapshot / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


class ProbeCache:
    def __init__(self, path: Path, snapshot: str, command: str) -> None:
        self.path = path
        self._scope = hashlib.sha256(f"{snapshot}\0{command}".encode()).hexdigest()[:16]
        self._lock = threading.Lock()
        self._entries = self._read()

    def get(self, sha: str) -> ProbeOutcome | None:
        entry = self._entries.get(self._key(sha))
        try:
            return ProbeOutcome.from_json(entry) if entry else None
        except (KeyError, TypeError):  # written by another version: probe again
            return None

    def put(self, sha: str, outcome: ProbeOutcome) -> None:
        if not outcome.deterministic:
            return
        with self._lock:
            entries = {**self._read(), **self._entries}  # keep what a concurrent run wrote
            entries[self._key(sha)] = _compact(outcome).to_json()
            self._entries = entries
            data = json.dumps({"version": CACHE_VERSION, "entries": entries})
            write_atomic(self.path, data.encode())

    def _key(self, sha: str) -> str:
        return f"{sha}:{self._scope}"

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # absent or damaged: start afresh rather than fail the bisect
            return {}
        return data.get("entries", {}) if data.get("version") == CACHE_VERSION else {}


def _compact(outcome: ProbeOutcome) -> ProbeOutcome:
    """Keep a big report's top-level summary, not its per-call lists."""
    report = outcome.report
    if report is None or len(json.dumps(report)) <= MAX_REPORT_CHARS:
        return outcome
    small = {k: v for k, v in report.items() if not isinstance(v, list)}
    return ProbeOutcome(**{**outcome.to_json(), "report": small})
