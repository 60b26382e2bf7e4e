"""The `replay` console script.

Importing the harness takes a second or two (torch, Triton, a CUDA driver's start). A Ctrl-C in
that time ends as one later does, with exit 130 and one line, not a traceback: the import happens
here, outside the `replay` package, whose first import is the slow one. A Ctrl-C is also
remembered, since the KeyboardInterrupt it raises can land in third-party code that catches
everything: a command that goes on as if nothing had been pressed still ends with 130.
"""
import signal
import sys

INTERRUPTED = 130


def main() -> None:
    pressed = []

    def on_interrupt(signum: int, frame: object) -> None:
        pressed.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        from replay.cli import main as cli
    except BaseException:  # a KeyboardInterrupt, or what one left behind (numpy half-imported: ImportError)
        if pressed:
            _interrupted()
        raise
    if pressed:  # during the import, and caught there
        _interrupted()
    try:
        cli()
    except SystemExit as exc:
        if pressed and exc.code != INTERRUPTED:  # caught, and the command went on
            _interrupted()
        raise


def _interrupted() -> None:
    sys.stderr.write("replay: interrupted\n")
    raise SystemExit(INTERRUPTED)
