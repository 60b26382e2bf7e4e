"""An output buffer's mask of unchanged elements (replay/snapshot/unwritten.py) made by one kernel.

unwritten.unchanged_mask makes it with eight torch operations: on a GPU, inside a recording that
pays for each operation on the program's thread, a launch of this kernel through its compiled
launcher (direct_launch.py) costs a fraction of that, for the same bits (tests hold the two
equal). The spans are passed as addresses, so one compiled variant serves every buffer of an
element size (two: buffers of 2^31 elements or more have one of their own, DirectLauncher's
widths): nothing compiles mid-recording after the first mask of each kind. Where the kernel
fails on a device (it compiles no more, say), torch's operators make the masks there from then
on: a recording never fails for want of its own kernel.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from replay.direct_launch import DirectLauncher
from replay.snapshot import unwritten

log = logging.getLogger("replay")

DEVICES = ("cuda",)  # where the kernel makes the mask (else torch does); tests add "cpu" for the interpreter
_BYTES = 1024  # mask bytes a program writes: 8192 elements
_WORDS = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}  # an element compared as one integer, bit for bit


@triton.jit(do_not_specialize=["before", "after", "mask", "elements"])  # one variant an element size
def _unchanged_bits_kernel(before, after, mask, elements, WORD: tl.constexpr, BYTES: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BYTES
    byte = start + tl.arange(0, BYTES)
    bit = tl.arange(0, 8)
    element = byte[:, None] * 8 + bit[None, :]
    inside = element < elements
    was = tl.load(before.to(tl.pointer_type(WORD)) + element, mask=inside, other=0)
    now = tl.load(after.to(tl.pointer_type(WORD)) + element, mask=inside, other=0)
    same = ((was == now) & inside).to(tl.int32) << bit[None, :]  # past the end: 0, as the torch version pads
    # a byte holds an element: `byte` is 64 bits, where `elements + 7` of a 32-bit `elements` could wrap
    tl.store(mask.to(tl.pointer_type(tl.uint8)) + byte, tl.sum(same, axis=1).to(tl.uint8), mask=byte * 8 < elements)


_LAUNCHERS = {size: DirectLauncher(_unchanged_bits_kernel, {"WORD": word, "BYTES": _BYTES}, num_warps=4)
              for size, word in _WORDS.items()}  # by element size
_FAILED: set[torch.device] = set()  # devices where the kernel failed: torch's operators there


def unchanged_mask(before: torch.Tensor, after: torch.Tensor, elements: int,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """What unwritten.unchanged_mask gives for two spans of `elements` elements of `after`'s dtype,
    each starting at its tensor's first element (`before` may hold its span as bytes, uint8: no
    view to make), made on their stream with no wait: on DEVICES by the kernel, into `mask` where
    given (uint8, unwritten.mask_bytes(elements) long), elsewhere by torch's operations."""
    device = after.device
    if device.type not in DEVICES or device in _FAILED:
        return _by_torch(before, after, elements)
    if mask is None:
        mask = torch.empty(unwritten.mask_bytes(elements), dtype=torch.uint8, device=device)
    if elements:
        try:
            _LAUNCHERS[after.element_size()].launch(device, (-(-unwritten.mask_bytes(elements) // _BYTES), 1, 1),
                                                    before.data_ptr(), after.data_ptr(), mask.data_ptr(), elements)
        except Exception as exc:
            _FAILED.add(device)
            log.warning(f"replay: capture: the recorder's mask kernel failed on {device} ({type(exc).__name__}: "
                        f"{exc}); output buffers' masks are made by torch's operators there from now on")
            return _by_torch(before, after, elements)
    return mask


def _by_torch(before: torch.Tensor, after: torch.Tensor, elements: int) -> torch.Tensor:
    spans = [torch.as_strided(t.detach().view(after.dtype), (elements,), (1,)) for t in (before, after)]
    return unwritten.unchanged_mask(*spans)
