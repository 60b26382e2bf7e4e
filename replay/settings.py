"""Every environment variable kernel-replay reads, declared once: its type, default and meaning.

Code reads a setting (`settings.TAGS.get()`), never `os.environ`; README.md lists them all (a
test holds it to this table). A malformed value is a SettingError naming the variable and what it
takes. This module imports nothing of replay but its errors, so that every layer may read settings.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from replay.errors import ReplayError

T = TypeVar("T")


class SettingError(ReplayError):
    """An environment variable of kernel-replay's holds a value it does not take (bad input)."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    parse: Callable[[str], T]
    default: T
    help: str
    takes: str  # what a value looks like, for the error and the README

    def get(self) -> T:
        """The value set in the environment, else the default (an empty value counts as unset)."""
        raw = os.environ.get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError:
            raise SettingError(f"{self.name}={raw!r}: takes {self.takes}") from None

    @property
    def is_set(self) -> bool:
        return bool(os.environ.get(self.name, "").strip())


def _flag(raw: str) -> bool:
    value = raw.lower()
    if value not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(raw)
    return value in ("1", "true", "yes", "on")


def _choice(*allowed: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if raw not in {str(a) for a in allowed}:
            raise ValueError(raw)
        return int(raw)
    return parse


def _whole(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(raw)
    return int(raw)


def _names(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise ValueError(raw)
    return names


def _size(raw: str) -> int:
    number, unit = (raw[:-1], raw[-1].upper()) if raw[-1:].isalpha() else (raw, "")
    if not number.isdigit() or unit not in _UNITS:
        raise ValueError(raw)
    return int(number) << _UNITS[unit]


_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def _range(raw: str) -> tuple[int, int | None]:
    first, colon, end = raw.partition(":")
    if not colon or not (first.isdigit() or not first) or not (end.isdigit() or not end):
        raise ValueError(raw)
    start, stop = int(first or 0), int(end) if end else None
    if stop is not None and stop < start:
        raise ValueError(raw)
    return start, stop


CAPTURE = Setting("REPLAY_CAPTURE", str, "", "record the whole process into this snapshot directory (written out "
                  "at exit), from the interpreter's start where kernel-replay is installed in site-packages, else "
                  "from `import replay` on; its child processes are not recorded", "a directory path")
CAPTURE_STRICT = Setting("REPLAY_CAPTURE_STRICT", _flag, False, "a capture error raises in the call that met it "
                         "instead of being reported once and skipped", "1 or 0")
TAGS = Setting("REPLAY_TAGS", _choice(0, 1, 2), 1, "which tags a recording keeps: 0 none, 1 those tagged at level 1, "
               "2 all", "0 (off), 1 (tagged) or 2 (everything)")
CAPTURE_TRITON = Setting("REPLAY_CAPTURE_TRITON", _flag, True, "a recording keeps every Triton launch made outside "
                         "a recorded call as a call of its own", "1 or 0")
CAPTURE_TORCH_OPS = Setting("REPLAY_CAPTURE_TORCH_OPS", _flag, False, "a recording keeps every PyTorch operator "
                            "call (aten, torch.library custom ops) made outside a recorded call", "1 or 0")
CAPTURE_ONLY: Setting[tuple[str, ...]] = Setting("REPLAY_CAPTURE_ONLY", _names, (), "record the calls of these kernels (and torch ops) only "
                       "(globs on module.kernel, aten.op.overload, or the last part)", "glob,glob,...")
CAPTURE_SKIP: Setting[tuple[str, ...]] = Setting("REPLAY_CAPTURE_SKIP", _names, (), "do not record the calls of these kernels (and torch ops)", "glob,glob,...")
CAPTURE_CALLS: Setting[tuple[int, int | None]] = Setting("REPLAY_CAPTURE_CALLS", _range, (0, None), "of each kernel (and torch op), record "
                           "the calls numbered first (from 0) up to end", "first:end (either may be left out)")
CAPTURE_STEPS: Setting[tuple[int, int | None]] = Setting("REPLAY_CAPTURE_STEPS", _range, (0, None), "record the "
                         "calls (launches, torch ops) made in the program's steps first up to end (replay.step() marks "
                         "them; 0 before the first mark)", "first:end (either may be left out)")
CAPTURE_MAX_BYTES = Setting("REPLAY_CAPTURE_MAX_BYTES", _size, 0, "stop recording once the calls "
                            "recorded hold this many bytes (the manifest and stderr say so); 0: no budget",
                            "a size: 500M, 2G, 1048576 (K, M, G, T: powers of 1024)")
CAPTURE_RING = Setting("REPLAY_CAPTURE_RING", _whole, 0, "a flight recorder: keep only the last this many calls "
                       "and write them when an uncaught exception ends the program, on SIGUSR1 (it goes on) or on "
                       "SIGTERM; 0: record every call", "a whole number of calls")
CAPTURE_RING_BYTES = Setting("REPLAY_CAPTURE_RING_BYTES", _size, 0, "the flight recorder's budget of host memory "
                             "(REPLAY_CAPTURE_RING); 0: 1G", "a size: 500M, 2G (K, M, G, T: powers of 1024)")
CAPTURE_STATE: Setting[tuple[str, ...]] = Setting("REPLAY_CAPTURE_STATE", _names, (), "more parameter names a launch's runtime state goes by "
                        "(besides position_buf, seq_len_buf, kv_cache_lengths)", "name,name,...")
VERIFY = Setting("REPLAY_VERIFY", str, "", "verify these ops' calls against their references, from `import replay` "
                 "on (replay.verify)", "op[@rate],op[@rate],... (rate a share of calls, 0.01 where none is given)")
VERIFY_DIR = Setting("REPLAY_VERIFY_DIR", str, "replay-verify", "where replay.verify writes mismatch snapshots",
                     "a directory path")
VERIFY_REPORT = Setting("REPLAY_VERIFY_REPORT", _flag, False, "print replay.verify's counters at exit", "1 or 0")
READ_LIMIT_MIB = Setting("REPLAY_READ_LIMIT_MIB", _whole, 256, "what reading one call of a snapshot may make in "
                         "memory, at least (docs/FORMAT.md: 64 times the bytes the call stores, or this)",
                         "a whole number of MiB")
CACHE_DIR = Setting("REPLAY_CACHE_DIR", str, "~/.cache/kernel-replay", "where snapshots read from URLs are kept "
                    "(each file once, by its sha256) and `replay record -o URL` records before uploading",
                    "a directory path")
RUN_ID = Setting("REPLAY_RUN_ID", str, "", "the run the ranks of a torchrun program belong to, kept in each rank's "
                 "manifest (`replay record` sets one; else torchrun's TORCHELASTIC_RUN_ID)", "any text")
TRACEBACK = Setting("REPLAY_TRACEBACK", _flag, False, "print the traceback of an internal error (a bug in "
                    "kernel-replay) besides its one line", "1 or 0")

ALL: tuple[Setting, ...] = (CAPTURE, CAPTURE_STRICT, CAPTURE_TRITON, CAPTURE_TORCH_OPS, CAPTURE_ONLY, CAPTURE_SKIP, CAPTURE_CALLS, CAPTURE_STEPS,
                            CAPTURE_STATE, CAPTURE_MAX_BYTES, CAPTURE_RING, CAPTURE_RING_BYTES, TAGS, VERIFY, VERIFY_DIR, VERIFY_REPORT, READ_LIMIT_MIB, CACHE_DIR, RUN_ID,
                            TRACEBACK)
