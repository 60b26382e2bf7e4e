"""Snapshots on object storage (fsspec URLs): read through a local cache by digest, recorded by upload.

    is_url(text)                          s3://, gs://, memory://, file://: a protocol fsspec knows
    local_snapshot(location)              the local directory the reader reads: a path unchanged, a
                                          URL fetched into the cache ($REPLAY_CACHE_DIR)
    as_url(message)                       a message naming the cached copy, said with the URL
    upload_snapshot(local, url)           a finished snapshot put at a URL, its manifest last
    staging_snapshot, upload_recording    `replay record -o URL`: record locally, then upload

fsspec is an optional extra (`pip install kernel-replay[fsspec]`), imported only once a URL is met.
"""
from replay.storage.fetch import Progress, as_url, local_snapshot
from replay.storage.staging import staging_snapshot, upload_recording
from replay.storage.upload import ensure_vacant, upload_snapshot
from replay.storage.urls import is_url

__all__ = ["Progress", "as_url", "ensure_vacant", "is_url", "local_snapshot", "staging_snapshot", "upload_recording",
           "upload_snapshot"]
