"""The one error bisect raises for bad input; the CLI prints it as one line, exit 2."""
from __future__ import annotations

from replay.errors import ReplayError


class BisectError(ReplayError):
    """Bad refs, a bad range, a missing snapshot, or ends whose probes contradict them."""
