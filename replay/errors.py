"""Error types, each carrying the exit code the CLI reports (docs/ARCHITECTURE.md: the rules every box keeps)."""
from __future__ import annotations

EXIT_PASS = 0
EXIT_DIVERGED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70  # a bug in kernel-replay itself (sysexits' EX_SOFTWARE): never a verdict
EXIT_UNTESTABLE = 125
EXIT_INTERRUPTED = 130  # Ctrl-C (and SIGTERM during a bisect), as a shell reports it


class ReplayError(Exception):
    """Bad input: the message is one line naming the file, op or argument."""

    exit_code = EXIT_BAD_INPUT


class SnapshotError(ReplayError):
    """A snapshot (or one of its files) is missing, corrupt or of an unknown format."""


class CaptureError(ReplayError):
    """A call could not be recorded (argument not representable, write failure)."""


class RegistryError(ReplayError):
    """Unknown op, variant or backend."""


class BisectError(ReplayError):
    """Bad refs, a bad range, a missing snapshot, or ends whose probes contradict them."""


class UntrustedProviderError(ReplayError):
    """A snapshot names a provider module the user has not trusted (replay/trust.py)."""


class ProviderImportError(ReplayError):
    """The module that provides an op failed to import: this code cannot be tested."""

    exit_code = EXIT_UNTESTABLE


class CallUntestable(ReplayError):
    """This code cannot make or run a recorded call that a whole-recording search needs."""

    exit_code = EXIT_UNTESTABLE
