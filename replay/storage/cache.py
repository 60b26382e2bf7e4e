"""The local cache of snapshots read from URLs: each fetched file kept once as objects/<sha256>,
and for each URL a view, views/<sha256 of the URL>/, a snapshot directory of links to those
objects that the local reader reads unchanged (and checks, as it checks any snapshot)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from replay import settings
from replay.errors import ReplayError, SnapshotError

BLOCK_BYTES = 8 << 20  # what one read of a download holds


def cache_dir() -> Path:
    """$REPLAY_CACHE_DIR, else ~/.cache/kernel-replay."""
    return Path(settings.CACHE_DIR.get()).expanduser().absolute()  # messages name it absolute (storage.as_url)


class ObjectCache:
    """Files kept by their sha256 under `root`/objects, read-only (a view's links share them)."""

    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "objects"
        try:
            self.objects.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReplayError(f"{root}: cannot make the cache directory: {exc.strerror or exc} "
                              f"(set {settings.CACHE_DIR.name})") from None

    def path(self, digest: str) -> Path:
        return self.objects / digest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def take(self, source: BinaryIO, limit: int, name: str) -> str:
        """Copy `source` into the cache, hashing it on the way; its sha256. More than `limit` bytes
        is a SnapshotError naming `name`: nothing of it is kept."""
        tmp = self.objects / f".{uuid.uuid4().hex}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                while block := source.read(BLOCK_BYTES):
                    size += len(block)
                    if size > limit:
                        raise SnapshotError(f"{name}: more than the {limit} bytes the reader takes of it; refused")
                    digest.update(block)
                    out.write(block)
            tmp.chmod(0o444)
            os.replace(tmp, self.path(digest.hexdigest()))
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return digest.hexdigest()

    def view(self, url: str) -> View:
        return View(self, url)


class View:
    """The snapshot directory that stands for `url`: files placed as links to objects (copies where
    links fail), each replaced whole, and what was learnt of the remote files kept beside it."""

    def __init__(self, cache: ObjectCache, url: str):
        name = hashlib.sha256(url.encode()).hexdigest()
        self.cache, self.url = cache, url
        self.path = cache.root / "views" / name
        self._record = cache.root / "views" / f"{name}.json"

    def place(self, rel: str, digest: str) -> None:
        target = self.path / rel
        source = self.cache.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if os.path.samefile(source, target):
                return
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.link")
        try:
            os.link(source, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)

    def keep_only(self, kept: set[str]) -> None:
        """Remove what a former read placed that the remote snapshot no longer holds."""
        for folder, _, names in os.walk(self.path):
            for name in names:
                path = Path(folder) / name
                if path.relative_to(self.path).as_posix() not in kept:
                    path.unlink()

    def remembered(self) -> dict[str, Any]:
        """rel -> {size, stamp, sha256} of the files whose content only a fetch could tell."""
        try:
            record = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        files = record.get("files") if isinstance(record, dict) and record.get("url") == self.url else None
        return files if isinstance(files, dict) else {}

    def remember(self, files: dict[str, Any]) -> None:
        tmp = self._record.with_name(f".{self._record.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"url": self.url, "files": files}))
        os.replace(tmp, self._record)
