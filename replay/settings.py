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


CAPTURE = Setting("REPLAY_CAPTURE", str, "", "record the whole process into this snapshot directory, from "
                  "`import replay` on (written out at exit)", "a directory path")
CAPTURE_STRICT = Setting("REPLAY_CAPTURE_STRICT", _flag, False, "a capture error raises in the call that met it "
                         "instead of being reported once and skipped", "1 or 0")
TAGS = Setting("REPLAY_TAGS", _choice(0, 1, 2), 1, "which tags a recording keeps: 0 none, 1 those tagged at level 1, "
               "2 all", "0 (off), 1 (tagged) or 2 (everything)")
VERIFY = Setting("REPLAY_VERIFY", str, "", "verify these ops' calls against their references, from `import replay` "
                 "on (replay.verify)", "op[@rate],op[@rate],... (rate a share of calls, 0.01 where none is given)")
VERIFY_DIR = Setting("REPLAY_VERIFY_DIR", str, "replay-verify", "where replay.verify writes mismatch snapshots",
                     "a directory path")
VERIFY_REPORT = Setting("REPLAY_VERIFY_REPORT", _flag, False, "print replay.verify's counters at exit", "1 or 0")
READ_LIMIT_MIB = Setting("REPLAY_READ_LIMIT_MIB", _whole, 256, "what reading one call of a snapshot may make in "
                         "memory, at least (docs/FORMAT.md: 64 times the bytes the call stores, or this)",
                         "a whole number of MiB")
TRACEBACK = Setting("REPLAY_TRACEBACK", _flag, False, "print the traceback of an internal error (a bug in "
                    "kernel-replay) besides its one line", "1 or 0")

ALL: tuple[Setting, ...] = (CAPTURE, CAPTURE_STRICT, TAGS, VERIFY, VERIFY_DIR, VERIFY_REPORT, READ_LIMIT_MIB,
                            TRACEBACK)
