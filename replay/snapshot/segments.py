"""Format 4's segments read back: a file of many calls, read whole and checked once, split by call.

A segment's tensor keys and metadata entries start with their call's prefix ('c000017/in/x',
'c000017/replay.call'); a key with no such prefix makes the segment unreadable. Calls are read in
order, so the last few segments read are kept (SEGMENTS_KEPT_BYTES), and every call taken from
one gets copies of its tensors: a caller may change them without changing the next reading.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile
from replay.snapshot.confined import ConfinedDir, one_line

SEGMENTS_KEPT_BYTES = 256 << 20
_PREFIX = re.compile(r"c[0-9]{6,}/")


@dataclass(frozen=True)
class Segment:
    metadata: dict[str, Any]
    calls: dict[str, dict[str, torch.Tensor]]  # a call's prefix -> its tensors, by key without it
    nbytes: int


def parse_segment(path: Path, data: bytes) -> Segment:
    """A segment's metadata and tensors, grouped by call, from its bytes."""
    try:
        metadata = callfile.read_metadata(data)
        spans = callfile.read_spans(data)
    except Exception as exc:  # safetensors raises several types for bad data
        raise SnapshotError(f"{path}: unreadable segment: {one_line(exc)}") from None
    calls: dict[str, dict[str, torch.Tensor]] = {}
    for key, span in spans.items():
        prefix = _PREFIX.match(key)
        if prefix is None:
            raise SnapshotError(f"{path}: tensor {key[:80]!r} names no call (keys start 'c<index>/')")
        calls.setdefault(prefix.group(), {})[key[prefix.end():]] = span
    return Segment(metadata, calls, len(data))


class SegmentReader:
    """The calls of a snapshot's segments, each segment read (and its sha256 checked) once while kept."""

    def __init__(self, files: ConfinedDir, kept_bytes: int = SEGMENTS_KEPT_BYTES):
        self.files, self.kept_bytes = files, kept_bytes
        self._kept: OrderedDict[tuple[str, str], Segment] = OrderedDict()

    def call(self, rel: str, sha256: str, nbytes: int, prefix: str) -> tuple[str, dict[str, torch.Tensor], int]:
        """Call `prefix` of segment `rel`: its description's JSON, copies of its tensors, and the
        bytes it stores in the segment."""
        segment = self._segment(rel, sha256, nbytes)
        try:
            text = callfile.call_text(segment.metadata, prefix)
        except ValueError as exc:
            raise SnapshotError(f"{self.files.path / rel}: {one_line(exc)}") from None
        spans = {key: span.clone() for key, span in segment.calls.get(prefix, {}).items()}
        return text, spans, len(text) + sum(span.numel() * span.element_size() for span in spans.values())

    def _segment(self, rel: str, sha256: str, nbytes: int) -> Segment:
        key = (rel, sha256)
        segment = self._kept.get(key)
        if segment is not None:
            self._kept.move_to_end(key)
            return segment
        segment = parse_segment(self.files.path / rel, self.files.read_verified(rel, sha256, nbytes))
        self._kept[key] = segment
        while sum(s.nbytes for s in self._kept.values()) > self.kept_bytes and len(self._kept) > 1:
            self._kept.popitem(last=False)
        return segment
