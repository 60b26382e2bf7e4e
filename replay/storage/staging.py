"""`replay record -o URL`: the program records into a local directory under the cache, uploaded
once it is finished; kept, and said where, when the upload fails."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from replay.errors import ReplayError
from replay.snapshot.confined import one_line
from replay.storage.cache import cache_dir
from replay.storage.fetch import Progress
from replay.storage.upload import ensure_vacant, upload_snapshot


def staging_snapshot(url: str, cache: Path | None = None) -> Path:
    """A new local snapshot path (not made yet: a program that records nothing leaves nothing) to
    record into before uploading to `url`; refused at once when `url` already holds a snapshot,
    rather than after the program ran."""
    ensure_vacant(url)
    return (cache or cache_dir()) / "recordings" / f"record-{uuid.uuid4().hex}"


def upload_recording(local: Path, url: str, progress: Progress | None = None) -> None:
    """Upload the recording at `local` (made by staging_snapshot) to `url`, then remove it."""
    try:
        upload_snapshot(local, url, progress)
    except ReplayError as exc:
        raise ReplayError(f"{one_line(exc)}; the recording is kept at {local}") from None
    shutil.rmtree(local, ignore_errors=True)
