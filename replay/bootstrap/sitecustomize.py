"""Put first on PYTHONPATH by `replay record`: the recorded command's Python process imports
replay before its own code, and replay starts recording from REPLAY_CAPTURE (with the
REPLAY_CAPTURE_* options) at import (replay_autostart.py says which process records). The
sitecustomize this one shadows, if the environment has one, runs first. In an environment where
kernel-replay is installed, its `kernel_replay.pth` has started the recording already (as site
looked for this module) and taken REPLAY_CAPTURE out of the environment: this one then finds
nothing to do but run the one it shadows.
"""
import importlib
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _start_recording() -> None:
    try:
        import replay_autostart
    except ImportError as exc:  # kernel-replay is not installed for this Python: the program runs unrecorded
        if os.environ.pop("REPLAY_CAPTURE", None):
            print(f"replay record: could not start recording: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    replay_autostart.start("replay record")


_run_shadowed_sitecustomize()
_start_recording()
