"""The `replay` console script.

Importing the harness takes a second or two (torch, Triton, a CUDA driver's start). A Ctrl-C in
that time ends as one later does, with exit 130 and one line, not a traceback: the import happens
here, outside the `replay` package, whose first import is the slow one. After it, a Ctrl-C is
also remembered, since the KeyboardInterrupt it raises can land in third-party code that catches
everything: a command that goes on as if nothing had been pressed still ends with 130.
"""
import os
import signal
import sys

INTERRUPTED = 130


def main() -> None:
    signal.signal(signal.SIGINT, _exit_now)
    from replay.cli import main as cli
    pressed = []

    def on_interrupt(signum: int, frame: object) -> None:
        pressed.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        cli()
    except SystemExit as exc:
        if pressed and exc.code != INTERRUPTED:  # caught, and the command went on
            _interrupted()
        raise


def _exit_now(signum: int, frame: object) -> None:
    """Ctrl-C while the harness imports: nothing is written yet, so the process ends here. Raising
    KeyboardInterrupt instead can land in a C++ extension's callback into Python (torch's
    pybind11 module init), which aborts the process rather than unwinding."""
    sys.stderr.write("replay: interrupted\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)


def _interrupted() -> None:
    sys.stderr.write("replay: interrupted\n")
    raise SystemExit(INTERRUPTED)
