"""An output buffer's contents before a call, stored as which elements the call left unchanged
(format 5, docs/FORMAT.md "Output buffers").

What a kernel's output buffer held before it ran (torch.empty's leftovers) is no input: it
matters only where the kernel leaves an element unwritten. So instead of those bytes, a
recording may store a bit per element of the buffer's storage span, set where the element was
the same after the call as before (`kept/<name>`); the buffer before the call is then the
buffer after it (`out/<name>`) where the bit is set, and bytes 0xFF (a NaN, or -1) elsewhere
(zero bytes where the element after the call is 0xFF bytes itself; for bool, the other value).
Replayed on that, a kernel that writes what it wrote when recorded gives the recorded output; one
that leaves unwritten an element it wrote then leaves there a value that differs, which shows.

Bits are packed eight elements to a byte, element i at bit i % 8 of byte i // 8.
"""
from __future__ import annotations

import torch

FILL = 0xFF  # each byte of an element the call changed, in the buffer made again
_SHIFTS: dict[torch.device, torch.Tensor] = {}
_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # bitwise equality, by element size


def _shifts(device: torch.device) -> torch.Tensor:
    """0..7, the bit of each of eight elements, made once a device (a recording masks at every call)."""
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(8, dtype=torch.uint8, device=device)
    return shifts


def mask_bytes(elements: int) -> int:
    """The bytes of the mask of a span of `elements` elements."""
    return -(-elements // 8)


def unchanged_mask(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The packed bits (uint8) of which elements of `after` equal those of `before`, bit for bit:
    two 1-D spans of one dtype and length, on any device; a few operations on its stream, no wait."""
    integer = _INTEGERS[after.element_size()]
    bits = (before.view(integer) == after.view(integer)).view(torch.uint8)
    tail = -bits.numel() % 8
    if tail:
        bits = torch.nn.functional.pad(bits, (0, tail))
    return (bits.view(-1, 8) << _shifts(bits.device)).sum(dim=1, dtype=torch.uint8)


def changed_elements(mask: torch.Tensor, elements: int) -> torch.Tensor:
    """Which of a span's `elements` elements the call changed (bool, 1-D): the mask's bits unset."""
    return ((mask.view(-1, 1) >> _shifts(mask.device)) & 1).view(-1)[:elements] == 0


def before_from(after: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The span before the call, made from the span after it (1-D) and its mask (checked by the
    caller: uint8, mask_bytes(after.numel()) long): after's elements where the bit is set; where
    not, FILL bytes, or for an element that is FILL bytes after the call, zero bytes; for bool,
    the opposite value. Every element the call changed thus differs, bit for bit, from what it
    left there."""
    changed = changed_elements(mask, after.numel())
    made = after.clone()
    if after.dtype == torch.bool:  # any byte but 0 is True: only the other value differs
        made[changed] = ~after[changed]
        return made
    raw = made.view(torch.uint8).view(-1, after.element_size())
    rows = torch.full_like(raw[changed], FILL)
    rows[(raw[changed] == FILL).all(dim=1)] = 0
    raw[changed] = rows
    return made
