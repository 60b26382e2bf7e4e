"""Recording from a Python process's first line, where REPLAY_CAPTURE is set.

Two doors lead here before the program's own code runs: the `kernel_replay.pth` file that
installing kernel-replay puts in site-packages (any `REPLAY_CAPTURE=DIR python prog.py` in that
environment), and the sitecustomize that `replay record` puts first on PYTHONPATH (a command whose
Python is another environment's). Kept outside the `replay` package, whose import starts the
recording: this module decides first whether this process is the one to record, so that a Python
process without REPLAY_CAPTURE pays one environment lookup and nothing more.

Only the first Python process records: REPLAY_CAPTURE is taken out of the environment its
children inherit (a second process would find the snapshot taken). A distributed launcher
(torchrun, python -m torch.distributed.run) is the exception: it records nothing and leaves
REPLAY_CAPTURE to the ranks it starts, each of which records into REPLAY_CAPTURE/rank-<r>/.
"""
import os
import sys

LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def start(door: str = "REPLAY_CAPTURE") -> None:
    """Start recording into REPLAY_CAPTURE, if it is set and this process is not a distributed
    launcher; a failure is said on stderr, prefixed by `door`, and the program runs unrecorded."""
    if not os.environ.get("REPLAY_CAPTURE") or _is_distributed_launcher():
        return
    try:
        import replay  # noqa: F401 (starts recording from REPLAY_CAPTURE)
    except Exception as exc:  # the program runs all the same, unrecorded: say why
        print(f"{door}: could not start recording: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        os.environ.pop("REPLAY_CAPTURE", None)


def _is_distributed_launcher() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own arguments: `-m` and the script
    if len(argv) > 1 and os.path.basename(argv[1]) == "torchrun":
        return True
    return any(word == "-m" and argv[i + 1] in LAUNCHERS for i, word in enumerate(argv[:-1]))
