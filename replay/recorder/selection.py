"""Which of a program's unregistered calls a recording keeps (Triton launches, torch ops): names
matched against `only` and `skip` globs, of each name the calls numbered `first` to `end`, and
those made in the program's steps `steps` (replay.step() marks them)."""
from __future__ import annotations

import fnmatch
import threading
from collections import Counter

from replay.context import current_step
from replay.recorder.options import RecordingOptions


class Selection:
    """A name (`package.module.kernel`, `aten.add.Tensor`) is wanted when it, or its last dotted
    part, matches a glob of `only` (all, when empty) and none of `skip`; of a wanted name, the
    calls numbered `first` (from 0) up to `end` (exclusive; None: all) made in steps `first_step`
    up to `end_step` are kept."""

    def __init__(self, options: RecordingOptions):
        self.only, self.skip = options.only, options.skip
        self.first, self.end = options.calls
        self.first_step, self.end_step = options.steps
        self._wanted: dict[str, bool] = {}  # name -> it passes the globs
        self._seen: Counter[str] = Counter()  # calls of each wanted name so far
        self._lock = threading.Lock()

    def keeps(self, name: str) -> bool:
        """Whether this call of `name` is recorded (each call counts, kept or not)."""
        with self._lock:
            wanted = self._wanted.get(name)
            if wanted is None:
                wanted = self._wanted[name] = self._name_wanted(name)
            if not wanted:
                return False
            ordinal = self._seen[name]
            self._seen[name] += 1
        now = current_step()
        return (ordinal >= self.first and (self.end is None or ordinal < self.end)
                and now >= self.first_step and (self.end_step is None or now < self.end_step))

    def _name_wanted(self, name: str) -> bool:
        names = (name, name.rsplit(".", 1)[-1])
        matches = lambda globs: any(fnmatch.fnmatchcase(n, g) for g in globs for n in names)  # noqa: E731
        return (not self.only or matches(self.only)) and not matches(self.skip)
