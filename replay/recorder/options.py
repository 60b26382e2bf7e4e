"""What a recording is asked to do: one options object, each option said once (RecordingOptions)."""
from __future__ import annotations

from dataclasses import dataclass

from replay.recorder.pipeline import DEFAULT_QUEUE_DEPTH, SEGMENT_BYTES, SEGMENT_SECONDS, check_options

BLOB_THRESHOLD_BYTES = 64 * 1024
CHUNK_THRESHOLD_BYTES = 1 << 20
DEFAULT_RING_BYTES = 1 << 30
DEFAULT_STATE_NAMES = ("position_buf", "seq_len_buf", "kv_cache_lengths")


@dataclass(frozen=True)
class RecordingOptions:
    """How a recording keeps what it sees (`replay.recording(path, **options)` takes these).

    Attributes:
        notes: free text kept in the manifest.
        tag_level: 0 (no tags), 1 (level-1 tags) or 2 (all); default REPLAY_TAGS, else 1.
        strict: raise CaptureError on a capture failure, in the call that met it (strict capture
            writes on the calling thread); default REPLAY_CAPTURE_STRICT.
        blob_threshold: read-only tensors of at least this many bytes (weights) are stored once
            by content, in one blob, and shared between calls; below 1 MiB and passed to a call
            that writes a tensor stored in chunks, in 64 KiB pieces (a decode step's new K/V row
            is then one piece with the cache it is written into).
        chunk_threshold: state and arguments the op mutates (a KV cache) of at least this many
            bytes are stored as 64 KiB pieces in blobs/, by content: a piece already stored
            (unchanged since the last call, or zeros) costs nothing. Snapshot format 2; a snapshot
            with no such tensor stays format 1.
        asynchronous: write on threads of the recording's own (default); False writes each call
            before the program goes on.
        queue_depth: calls copied but not yet written, at most.
        when_full: with the queue full, "block" (the program waits; nothing is lost) or "drop"
            (the call is not recorded; the manifest's capture_errors counts and names the drops).
            On a GPU, "block" also waits (up to chunk_changes.STAGING_WAIT_S) for device room to
            stage a large tensor in, where "drop" copies it to the host at once.
        durability: "close" flushes the files to disk once, when the recording closes (a killed
            process loses nothing written: the page cache outlives it); "call" flushes each file
            as it is written (a call with its segment), for runs that may lose power.
        segment_bytes, segment_seconds: calls are written many to a file (a segment), closed once
            its calls hold `segment_bytes` or its first call is `segment_seconds` old; a killed
            process loses the open segment (calls that young) and the calls still queued.
            Synchronous recording writes a segment a call.
        ring: a flight recording: keep only the last `ring` calls, in host memory (the replays of
            a CUDA graph captured while it records: in a ring in device memory, brought over when
            dumped), and write them when an exception leaves the block, on SIGUSR1 (and go on),
            on SIGTERM (and exit; a second SIGTERM while they are written waits for them) or on
            `replay.dump()`; a block left normally writes none. A tensor stored in pieces (a KV
            cache a call writes a row of) is held as the pieces each call changed, and one whole
            copy for the oldest call that holds it.
        ring_bytes: the flight recording's budget of host memory for the calls it holds; the
            device rings of the graphs it captures share as much again (a graph whose ring does
            not fit comes over to the host at every replay). A
            read-only input of `blob_threshold` bytes or more (inside a CUDA graph: one of 16 KiB
            or more from outside the graph) is held once as a blob, for every call that reads it,
            outside the budget: weights cost their size once, but a fresh large input at every
            call is not bounded by it.
        triton: every Triton kernel launch made outside a recorded call is a call of its own
            (replay/triton_launches/): the kernel's parameters, the tensors it writes, its grid
            and config. False records registered and captured functions only.
        only, skip: globs of the kernels whose launches are recorded (all, when `only` is empty)
            and of those that are not, matched against `package.module.kernel` and the bare name.
        calls: (first, end): of each kernel, the launches numbered first (from 0) up to end
            (exclusive; None: all).
        steps: (first, end): keep the unregistered calls made in the program's steps first up to
            end (exclusive; None: all), as `replay.step()` numbers them (0 before the first).
        state_names: a launch's tensor parameters of these names are its runtime state.
        torch_ops: every PyTorch operator call (aten, torch.library custom ops) made outside a
            recorded call on the thread that starts the recording is a call of its own
            (replay/torch_ops/): views, factories and random draws excepted.
        max_bytes: a budget: once the calls handed to the writers hold this many bytes (their
            copies and each new blob), the recording stops, saying so in the manifest and on
            stderr; the program goes on. The call that crosses it is kept whole. 0: no budget.
            A flight recording is bounded by `ring_bytes` instead.
    """

    notes: str = ""
    tag_level: int | None = None
    strict: bool | None = None
    blob_threshold: int = BLOB_THRESHOLD_BYTES
    chunk_threshold: int = CHUNK_THRESHOLD_BYTES
    asynchronous: bool = True
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    when_full: str = "block"
    durability: str = "close"
    segment_bytes: int = SEGMENT_BYTES
    segment_seconds: float = SEGMENT_SECONDS
    ring: int | None = None
    ring_bytes: int = DEFAULT_RING_BYTES
    triton: bool = True
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    calls: tuple[int, int | None] = (0, None)
    steps: tuple[int, int | None] = (0, None)
    state_names: tuple[str, ...] = DEFAULT_STATE_NAMES
    torch_ops: bool = False
    max_bytes: int = 0

    def __post_init__(self) -> None:
        check_options(self.queue_depth, self.when_full)
        for name, (first, end) in (("calls", self.calls), ("steps", self.steps)):
            if first < 0 or (end is not None and end < first):
                raise ValueError(f"{name}={(first, end)!r}: a range (first, end) with 0 <= first <= end")
        if isinstance(self.segment_bytes, bool) or not isinstance(self.segment_bytes, int) or self.segment_bytes < 0:
            raise ValueError(f"segment_bytes={self.segment_bytes!r}: a number of bytes, at least 0")
        if not isinstance(self.segment_seconds, (int, float)) or not 0 < self.segment_seconds < float("inf"):
            raise ValueError(f"segment_seconds={self.segment_seconds!r}: a positive number of seconds")
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes={self.max_bytes}: a number of bytes, or 0 for no budget")
