"""One kernel per batch of stores of large tensors (a call's): each 64 KiB
piece's checksums, whether the piece changed since the last store from the same memory, and
(when asked) a device-side copy of the pieces that did, so that only those cross to the host
later, off the program's stream.

A checksum is two sums of the piece's 32-bit words under random 64-bit weights (fixed seed),
wrapping modulo 2^64. A change of one word by d is missed only where d times both its weights
vanishes modulo 2^64: with the weights' low bits random, odds about 2^-(128 - 2k) where 2^k
divides d (2^-66 at worst, a float's sign bit), and less for changes of many words; negligible
beside any hardware fault. A program sums a few pieces of one store, reading each once (and once
more, to copy it, only if it changed); the weights, 256 KiB, stay in L2 and are read once for all
the program's pieces (with a piece a program, reading the weights cost more than reading the
bytes). The stores of a batch are rows of a small table (their addresses, as gather_copy.py
reads its rows), so a call costs the program one launch and one table, not one launch a store.
A store staged packed (a room of fewer pieces than it has) gives each changed piece but those of
zeros the next slot of its room from a counter (an atomic add; the counter zeroed before the
launch), writes the slot beside the piece's checksums, and copies the piece there; a piece whose
slot is past the room is counted and not copied (piece_batch.py then takes the store whole).
On the CPU the kernel runs in Triton's interpreter (tests only: there sha256 costs the same).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from replay.context import recorder_kernel
from replay.direct_launch import DirectLauncher
from replay.recorder.piece_batch import ROW
from replay.snapshot.writer import CHUNK_BYTES

WORDS = CHUNK_BYTES // 4  # 32-bit words a piece
_BLOCK = 512
_GROUP = 4  # pieces a program sums: the weights, read from L2, are read once for all of them
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """[2, WORDS] random 64-bit weights on `device`, the same on every run."""
    weights = _WEIGHTS.get(device)
    if weights is None:
        gen = torch.Generator().manual_seed(0x5EED)
        with recorder_kernel():  # the recorder's own operators: never calls of the program
            weights = torch.randint(-(1 << 62), 1 << 62, (2, WORDS), generator=gen, dtype=torch.int64)
            weights = _WEIGHTS[device] = weights.to(device)
    return weights


# a store's row, int64: its words' address, their count, its first program, where its checksums go on
# the device and on the host (0: not there), its last store's checksums (0: none), its staged buffer (0:
# none), the pieces that buffer holds packed (0: whole pieces, each where it lies) and the address of the
# int32 counter, zero at the launch, that hands out their slots
COLUMNS = 9
WORDS_AT, NWORDS, FIRST, SUMS, HOST_SUMS, LAST, STAGED, ROOM, COUNTER = range(COLUMNS)


@triton.jit(do_not_specialize=["table", "stores"])  # one variant: no compile mid-recording
def _piece_sums_kernel(table, stores, weights_ptr, WORDS: tl.constexpr, BLOCK: tl.constexpr,
                       GROUP: tl.constexpr, ROW: tl.constexpr, COLUMNS: tl.constexpr):
    table_ptr = table.to(tl.int64).to(tl.pointer_type(tl.int64))  # in pinned host memory on a GPU: read in place
    # a row's columns, in COLUMNS' order: 0 words, 1 their count, 2 first program, 3 sums, 4 host sums, 5 last,
    # 6 staged, 7 room, 8 counter
    program = tl.program_id(0)
    store = 0  # the rows ascend by first program: this program's store is the last row starting at or before it
    for row in range(1, stores):
        store += (tl.load(table_ptr + row * COLUMNS + 2) <= program).to(tl.int32)
    row_ptr = table_ptr + store * COLUMNS
    # every store's words start 16-byte aligned and are a multiple of 16 bytes (trackable): vector loads
    words_ptr = tl.multiple_of(tl.load(row_ptr).to(tl.pointer_type(tl.int32)), 16)
    nwords = tl.multiple_of(tl.load(row_ptr + 1), 4)
    sums_ptr = tl.load(row_ptr + 3).to(tl.pointer_type(tl.int64))
    host = tl.load(row_ptr + 4)
    last = tl.load(row_ptr + 5)
    staged = tl.load(row_ptr + 6)
    room = tl.load(row_ptr + 7)
    pieces = (nwords + WORDS - 1) // WORDS
    piece = (program - tl.load(row_ptr + 2)).to(tl.int64) * GROUP + tl.arange(0, GROUP)
    real = piece < pieces
    base = piece * WORDS
    first = tl.zeros([GROUP, BLOCK], dtype=tl.int64)
    second = tl.zeros([GROUP, BLOCK], dtype=tl.int64)
    for start in range(0, WORDS, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        at = base[:, None] + offsets[None, :]
        word = tl.load(words_ptr + at, mask=at < nwords, other=0).to(tl.int64)  # the last piece: zero-padded
        first += word * tl.load(weights_ptr + offsets)[None, :]
        second += word * tl.load(weights_ptr + WORDS + offsets)[None, :]
    sum_first = tl.sum(first, axis=1)
    sum_second = tl.sum(second, axis=1)
    if last != 0:
        last_ptr = last.to(tl.pointer_type(tl.int64))
        changed = ((sum_first != tl.load(last_ptr + ROW * piece, mask=real, other=0))
                   | (sum_second != tl.load(last_ptr + ROW * piece + 1, mask=real, other=0)))
    else:
        changed = real  # nothing to compare with: every piece is new
    changed = changed & real
    # a packed store's changed pieces but those of zeros (known by their checksums, as the host names
    # them) take the next slots, in any order; a slot past the room is counted and not copied
    slot = tl.full([GROUP], -1, tl.int64)
    if staged != 0:
        if room != 0:
            moved = changed & ((sum_first != 0) | (sum_second != 0))
            counter_ptr = tl.load(row_ptr + 8).to(tl.pointer_type(tl.int32))
            taken = tl.atomic_add(counter_ptr + tl.zeros([GROUP], dtype=tl.int32), tl.full([GROUP], 1, tl.int32),
                                  mask=moved)
            slot = tl.where(moved, taken.to(tl.int64), -1)
    tl.store(sums_ptr + ROW * piece, sum_first, mask=real)
    tl.store(sums_ptr + ROW * piece + 1, sum_second, mask=real)
    tl.store(sums_ptr + ROW * piece + 2, changed.to(tl.int64), mask=real)
    tl.store(sums_ptr + ROW * piece + 3, slot, mask=real)
    if host != 0:  # the host's copy, written where the writer reads it: no copy to launch, no allocation
        host_ptr = host.to(tl.pointer_type(tl.int64))
        tl.store(host_ptr + ROW * piece, sum_first, mask=real)
        tl.store(host_ptr + ROW * piece + 1, sum_second, mask=real)
        tl.store(host_ptr + ROW * piece + 2, changed.to(tl.int64), mask=real)
        tl.store(host_ptr + ROW * piece + 3, slot, mask=real)
    if staged != 0:
        staged_ptr = tl.multiple_of(staged.to(tl.pointer_type(tl.int32)), 16)
        # whole pieces: each changed one where it lies; packed: each in its slot, within the room
        packed = room != 0
        kept = tl.where(packed, (slot >= 0) & (slot < room), changed)
        target = tl.where(packed, slot * WORDS, base)
        for start in range(0, WORDS, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            at = base[:, None] + offsets[None, :]
            moved_words = kept[:, None] & (at < nwords)  # only the pieces kept are read again
            tl.store(staged_ptr + target[:, None] + offsets[None, :], tl.load(words_ptr + at, mask=moved_words),
                     mask=moved_words)


def trackable(address: int, nbytes: int) -> bool:
    """Whether a run of bytes can be checksummed: 16-byte aligned, a multiple of 16 bytes long
    (read as 32-bit words, four at a time)."""
    return nbytes % 16 == 0 and address % 16 == 0 and nbytes > 0


def programs_of(pieces: int) -> int:
    """The kernel's programs for a store of `pieces` pieces."""
    return -(-pieces // _GROUP)


def launch(table: int, stores: int, programs: int, device: torch.device) -> None:
    """Checksum the `stores` stores whose rows (COLUMNS int64 each, each store's first program after
    the one before's) are at address `table` (pinned host memory, or the device's), `programs`
    programs in all, on `device`'s current stream: each piece's two checksums, whether it differs
    from its last store's (every piece does where there is none), stored as a [pieces, ROW] int64
    table on the device and on the host where the row says, and, where it has a staged buffer,
    the changed pieces copied into it where they lie."""
    _LAUNCHER.launch(device, (programs, 1, 1), table, stores, _weights(device))


_LAUNCHER = DirectLauncher(_piece_sums_kernel, {"WORDS": WORDS, "BLOCK": _BLOCK, "GROUP": _GROUP, "ROW": ROW,
                                                "COLUMNS": COLUMNS}, num_warps=8)


def piece_sums(raw: torch.Tensor, last: torch.Tensor | None, stage: bool,
               room: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One store alone, on its stream: a [pieces, ROW] int64 table of each piece's checksums,
    whether it differs from `last` (an earlier such table; every piece differs when it is None)
    and its slot, and, with `stage`, a device buffer (int32 words) holding the changed pieces: whole
    pieces, each where it lies in `raw` (the others left unwritten), or with a `room`, that many
    pieces, the changed ones but those of zeros each in its slot."""
    pieces = -(-raw.numel() // CHUNK_BYTES)
    sums = torch.empty(pieces, ROW, dtype=torch.int64, device=raw.device)
    staged = torch.empty((room or pieces) * WORDS, dtype=torch.int32, device=raw.device) if stage else None
    counter = torch.zeros(2, dtype=torch.int32, device=raw.device)
    row = [0] * COLUMNS
    row[WORDS_AT], row[NWORDS], row[SUMS] = raw.data_ptr(), raw.numel() // 4, sums.data_ptr()
    row[LAST] = last.data_ptr() if last is not None else 0
    row[STAGED] = staged.data_ptr() if staged is not None else 0
    row[ROOM], row[COUNTER] = room, counter.data_ptr()
    table = torch.tensor([row], dtype=torch.int64).to(raw.device)
    launch(table.data_ptr(), 1, programs_of(pieces), raw.device)
    return sums, staged
