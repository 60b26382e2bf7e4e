"""Put first on PYTHONPATH by `replay record`: the recorded command's Python process imports
replay before its own code, and replay starts recording from REPLAY_CAPTURE (with the
REPLAY_CAPTURE_* options) at import. The sitecustomize this one shadows, if the environment has
one, runs first. Only the first Python process records: REPLAY_CAPTURE is taken out of the
environment its children inherit (a second process would find the snapshot taken).
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
    if not os.environ.get("REPLAY_CAPTURE"):  # a child of the recorded process: nothing to load
        return
    try:
        import replay  # noqa: F401 (starts recording from REPLAY_CAPTURE)
    except Exception as exc:  # the program runs all the same, unrecorded: say why
        print(f"replay record: could not start recording: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        os.environ.pop("REPLAY_CAPTURE", None)


_run_shadowed_sitecustomize()
_start_recording()
