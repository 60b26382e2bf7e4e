"""What a bisect reports while it runs: one Step per event, for progress and `--log FILE`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO


@dataclass(frozen=True)
class Step:
    kind: str  # start, prune, cache, probe, result, round, warning, done
    message: str
    detail: str = ""  # more lines for the log file (a probe's output tail)
    data: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)

    def log_lines(self) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.at)) + f".{int(self.at % 1 * 1000):03d}"
        lines = [f"{stamp} {self.kind:<7} {self.message}"]
        lines += [f"{'':24}| {line}" for line in self.detail.splitlines()]
        return "\n".join(lines) + "\n"


StepHandler = Callable[[Step], None]


class StepLog:
    """Appends every step to a file as it happens, so a killed run's log is complete."""

    def __init__(self, path: Path) -> None:
        self._file: TextIO = open(path, "w", buffering=1)

    def __call__(self, step: Step) -> None:
        self._file.write(step.log_lines())

    def close(self) -> None:
        self._file.close()


def fan_out(*handlers: StepHandler | None) -> StepHandler:
    """One handler calling each of `handlers` that is not None."""
    chosen = [h for h in handlers if h is not None]

    def handle(step: Step) -> None:
        for handler in chosen:
            handler(step)
    return handle
