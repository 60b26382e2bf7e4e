"""Registers and stack (local memory) per thread of a compiled kernel, read from its cubin with no GPU.

A cubin is an ELF file; ptxas writes each kernel's register count into the `.nv.info` section as
attribute EIATTR_REGCOUNT (0x2f), and the stack it needs (register spills, local arrays) as
EIATTR_MIN_STACK_SIZE (0x12): each a (symbol index, value) pair of little-endian u32s. A loaded
kernel reports the same register count as `n_regs`, which needs a GPU to load it.
"""
from __future__ import annotations

import struct

_EIATTR_REGCOUNT = 0x2F
_EIATTR_MIN_STACK_SIZE = 0x12
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


def registers(cubin: bytes) -> int | None:
    """The largest register count any kernel in `cubin` declares; None when none is found or the
    file is not a 64-bit little-endian ELF."""
    return _largest(cubin, _EIATTR_REGCOUNT)


def stack_bytes(cubin: bytes) -> int | None:
    """The largest stack any kernel in `cubin` needs, in bytes a thread (0: no local memory)."""
    return _largest(cubin, _EIATTR_MIN_STACK_SIZE)


def _largest(cubin: bytes, wanted: int) -> int | None:
    values = [value for data in _sections(cubin, ".nv.info") for attr, raw in _attributes(data)
              if attr == wanted and len(raw) == 8 for _, value in [struct.unpack("<II", raw)]]
    return max(values, default=None)


def _sections(elf: bytes, prefix: str) -> list[bytes]:
    """The contents of the sections called `prefix` or `prefix.<anything>`; none from a file that
    is not a well-formed 64-bit little-endian ELF."""
    if elf[:6] != b"\x7fELF\x02\x01":
        return []
    try:
        shoff = struct.unpack_from("<Q", elf, 0x28)[0]
        entsize, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entsize) for i in range(count)]
        names_offset = headers[names_index][4]
        found = []
        for name_offset, _, _, _, offset, size in headers:
            start = names_offset + name_offset
            name = elf[start:elf.index(b"\0", start)].decode("ascii", "replace")
            if name == prefix or name.startswith(prefix + "."):
                found.append(elf[offset:offset + size])
        return found
    except (struct.error, IndexError, ValueError):  # offsets past the end: not a cubin this reader knows
        return []


def _attributes(data: bytes) -> list[tuple[int, bytes]]:
    """(attribute, value) entries of one .nv.info section."""
    found, i = [], 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", data, i + 2)[0]
            found.append((attr, data[i + 4:i + 4 + size]))
            i += 4 + size
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):  # 4 bytes each: a half-word value, or padding
            found.append((attr, data[i + 2:i + 4]))
            i += 4
        else:  # an encoding this reader does not know: stop rather than misread the rest
            break
    return found
