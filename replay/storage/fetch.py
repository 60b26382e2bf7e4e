"""A snapshot at a URL made a local directory the reader reads unchanged: the files it could open
fetched into the cache (those already there by sha256, or unchanged since the last fetch, not
again), then placed in the URL's view, content first, the index and the manifest last."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any, Callable

from replay.errors import ReplayError, SnapshotError
from replay.snapshot.confined import one_line
from replay.snapshot.writer import INDEX, MANIFEST
from replay.storage.cache import ObjectCache, cache_dir
from replay.storage.listing import (RemoteFile, landing_order, list_remote, readable_files, size_limit,
                                    snapshot_prefixes)
from replay.storage.urls import is_url, join, open_url

# (files done, files to do, the file just done): told of each file fetched or uploaded
Progress = Callable[[int, int, str], None]
FETCHES_AT_ONCE = 8  # object stores answer each request slowly, and many at once


def local_snapshot(location: str | Path, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """The local directory to read the snapshot at `location` from: a local path unchanged; a URL
    (s3://, gs://, memory://, file://, any protocol fsspec knows) fetched into `cache` (default:
    $REPLAY_CACHE_DIR, else ~/.cache/kernel-replay). A multi-rank parent brings every rank."""
    if isinstance(location, Path) or not is_url(location):
        return Path(location)
    url = location.rstrip("/")
    fs, root = open_url(url)
    files = list_remote(fs, root, url)
    prefixes = snapshot_prefixes(files, url)
    fetcher = _Fetcher(fs, root, url, files, ObjectCache(cache or cache_dir()), progress)
    # always fetched: they say what the snapshot is now
    heads = fetcher.fetch({rel: None for prefix in prefixes for rel in (prefix + MANIFEST, prefix + INDEX)
                           if rel in files}, fresh=True)
    wanted: dict[str, str | None] = {}
    for prefix in prefixes:
        index = fetcher.cache.path(heads[prefix + INDEX]).read_bytes() if prefix + INDEX in heads else b""
        wanted.update(readable_files(files, prefix, index, url))
    content = fetcher.fetch(wanted, fresh=False)
    view = fetcher.cache.view(url)
    for rel in sorted(content, key=landing_order):
        view.place(rel, content[rel])
    for rel in sorted(heads, key=landing_order):
        view.place(rel, heads[rel])
    view.keep_only(set(content) | set(heads))
    view.remember(fetcher.learnt)
    for path in {str(view.path), str(view.path.resolve())}:  # as made, and as a resolved path names it
        _VIEWS[path] = url
    return view.path


_VIEWS: dict[str, str] = {}  # the views this process made, by path -> the URL each stands for


def as_url(message: str) -> str:
    """`message` with each path of a view this process fetched said as its URL: a report or error
    names the file where the user put it, not where the cache keeps it."""
    for path, url in sorted(_VIEWS.items(), key=lambda item: -len(item[0])):
        message = message.replace(path, url)
    return message


class _Fetcher:
    """Fetches files of one URL into the cache, remembering the stamps of those whose content is
    not known by name."""

    def __init__(self, fs: Any, root: str, url: str, files: dict[str, RemoteFile], cache: ObjectCache,
                 progress: Progress | None):
        self.fs, self.root, self.url, self.files, self.cache, self.progress = fs, root, url, files, cache, progress
        self.known = cache.view(url).remembered()
        self.learnt: dict[str, Any] = {}

    def fetch(self, wanted: dict[str, str | None], fresh: bool) -> dict[str, str]:
        """rel -> sha256 of the object holding it: fetched unless `wanted` gives a digest the cache
        holds, or (not `fresh`) its remote size and stamp are those of the last fetch."""
        held: dict[str, str] = {}
        for rel, digest in wanted.items():
            cached = self._held(rel, digest, fresh)
            if cached:
                held[rel] = cached
        missing = sorted(set(wanted) - set(held))
        for rel in missing:
            limit = size_limit(rel)
            if self.files[rel].size > limit:
                raise SnapshotError(f"{self.url}/{rel}: {self.files[rel].size} bytes, more than the {limit} the "
                                    "reader takes of it; refused")
        with concurrent.futures.ThreadPoolExecutor(FETCHES_AT_ONCE) as pool:
            jobs = {pool.submit(self._download, rel): rel for rel in missing}
            try:
                for done, job in enumerate(concurrent.futures.as_completed(jobs), start=1):
                    held[jobs[job]] = job.result()
                    if self.progress:
                        self.progress(done, len(missing), jobs[job])
            except BaseException:
                for job in jobs:  # one failure (or Ctrl-C) ends the read: the rest need not come
                    job.cancel()
                raise
        for rel, digest in held.items():
            remote = self.files[rel]
            if remote.stamp and wanted[rel] is None and not fresh:
                self.learnt[rel] = {"size": remote.size, "stamp": remote.stamp, "sha256": digest}
        return held

    def _held(self, rel: str, digest: str | None, fresh: bool) -> str | None:
        """The digest of the cached object that is `rel` as it is now, if the cache can tell."""
        if digest is None and not fresh:
            remote, last = self.files[rel], self.known.get(rel)
            if isinstance(last, dict) and remote.stamp and last.get("size") == remote.size \
                    and last.get("stamp") == remote.stamp and isinstance(last.get("sha256"), str):
                digest = last["sha256"]
        return digest if digest is not None and self.cache.has(digest) else None

    def _download(self, rel: str) -> str:
        name = f"{self.url}/{rel}"
        try:
            with self.fs.open(join(self.root, rel), "rb") as source:
                return self.cache.take(source, size_limit(rel), name)
        except OSError as exc:
            raise ReplayError(f"{name}: cannot fetch: {one_line(exc)}") from None
