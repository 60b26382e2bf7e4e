"""The `replay` console script.

Importing the harness takes a second or two (torch, Triton). A Ctrl-C in that time ends as one
later does, with exit 130 and one line, not a traceback: the import happens here, outside the
`replay` package, whose first import is the slow one.
"""
import sys


def main() -> None:
    try:
        from replay.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("replay: interrupted\n")
        raise SystemExit(130) from None
    cli()
