"""Probe results kept per (commit, snapshot digest, command) in the repository's git dir.

A rerun, or a wider range, reuses every verdict already known. Only
deterministic outcomes are kept (exit 0, 1, 125); a timeout or an odd exit code is
retried next time. The file is rewritten atomically after every probe, so an
interrupted run keeps what it learnt. It is read as untrusted input: what is not
a usable entry (a damaged file, a stranger's edit) is dropped with one warning,
and the next write rebuilds the file from what is left.
"""
from __future__ import annotations

import logging
import hashlib
import json
import math
import stat
import threading
from pathlib import Path
from typing import Any

from replay.bisect.probe import ProbeOutcome, verdict_for
from replay.ranks.layout import snapshot_members
from replay.snapshot.files import write_atomic
from replay.snapshot.writer import INDEX, MANIFEST

log = logging.getLogger(__name__)

CACHE_NAME = "replay-bisect-cache.json"
CACHE_VERSION = 1
MAX_REPORT_CHARS = 64_000
MAX_REPORT_DEPTH = 32  # a report nested deeper is no replay report, and could overflow the JSON encoder


def snapshot_digest(snapshot: Path | None) -> str:
    """sha256 of manifest.json and calls.jsonl (each rank's, for a multi-rank recording): cheap, and
    complete, because every index line carries the sha256 of its call's files."""
    if snapshot is None:
        return "-"
    digest = hashlib.sha256()
    for rank, member in snapshot_members(snapshot).items():
        prefix = f"{member.name}/" if rank is not None else ""  # a single snapshot's digest as it always was
        for name in (MANIFEST, INDEX):
            path = member / name
            digest.update((prefix + name).encode() + b"\0")
            digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


class ProbeCache:
    def __init__(self, path: Path, snapshot: str) -> None:
        self.path = path
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._warned: set[str] = set()  # each kind of trouble is told once, however often it is met
        self._entries = self._read()

    def get(self, sha: str, command: str) -> ProbeOutcome | None:
        """What `command` (a ProbeCommand's identity) found at `sha` before, if it was kept."""
        entry = self._entries.get(self._key(sha, command))
        return ProbeOutcome.from_json(entry) if entry is not None else None

    def put(self, sha: str, command: str, outcome: ProbeOutcome) -> None:
        if not _usable_outcome(outcome):  # a timeout, an odd exit code, a report nested past reason
            return
        entry = _compact(outcome).to_json()
        with self._lock:
            entries = {**self._read(), **self._entries}  # keep what a concurrent run wrote
            entries[self._key(sha, command)] = entry
            self._entries = entries
            data = json.dumps({"version": CACHE_VERSION, "entries": entries})
            try:
                write_atomic(self.path, data.encode())
            except OSError as exc:  # a full disk, a directory in the way: bisect on, unremembered
                self._warn_once("write", f"{self.path}: cannot write ({exc.strerror or exc}); results are not kept")

    def _key(self, sha: str, command: str) -> str:
        scope = hashlib.sha256(f"{self._snapshot}\0{command}".encode()).hexdigest()[:16]
        return f"{sha}:{scope}"

    def _read(self) -> dict[str, Any]:
        """The usable entries on disk: the rest is reported once, and left out of the next write."""
        try:
            if not stat.S_ISREG(self.path.stat().st_mode):
                return self._damaged("not a regular file")  # a FIFO would block the read for ever
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            return self._damaged(f"unreadable: {exc.strerror or exc}")
        except (ValueError, RecursionError):
            return self._damaged("not JSON")
        version = data.get("version") if isinstance(data, dict) else None
        if type(version) is int and version != CACHE_VERSION:  # another version's: start afresh
            return {}
        if type(version) is not int or not isinstance(data.get("entries"), dict):
            return self._damaged("not a probe cache")
        entries = {key: entry for key, entry in data["entries"].items() if _usable(entry)}
        if len(entries) < len(data["entries"]):
            self._damaged(f"{len(data['entries']) - len(entries)} unusable entries")
        return entries

    def _damaged(self, why: str) -> dict[str, Any]:
        self._warn_once("read", f"{self.path}: damaged ({why}); probing again and rebuilding it")
        return {}

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(f"replay: warning: {message}")


def _usable(entry: Any) -> bool:
    """An outcome this version would write."""
    try:
        return isinstance(entry, dict) and _usable_outcome(ProbeOutcome.from_json(entry))
    except KeyError:
        return False


def _usable_outcome(outcome: ProbeOutcome) -> bool:
    """A verdict its exit code gives, fields of the types they have, a report that is no deep trap."""
    code, seconds, report = outcome.exit_code, outcome.seconds, outcome.report
    return (type(code) is int and outcome.deterministic and verdict_for(code)[0] == outcome.verdict
            and isinstance(outcome.reason, str) and isinstance(outcome.output_tail, str)
            and type(seconds) in (int, float) and math.isfinite(seconds)
            and (report is None or isinstance(report, dict) and _shallow(report, MAX_REPORT_DEPTH)))


def _shallow(value: Any, levels: int) -> bool:
    """No more than `levels` dicts and lists deep."""
    layer = [value]
    for _ in range(levels):
        layer = [item for v in layer if isinstance(v, (dict, list))
                 for item in (v.values() if isinstance(v, dict) else v)]
        if not layer:
            return True
    return False


def _compact(outcome: ProbeOutcome) -> ProbeOutcome:
    """Keep a big report's top-level summary, not its per-call lists."""
    report = outcome.report
    if report is None or len(json.dumps(report)) <= MAX_REPORT_CHARS:
        return outcome
    small = {k: v for k, v in report.items() if not isinstance(v, list)}
    return ProbeOutcome(**{**outcome.to_json(), "report": small})
