"""Put first on PYTHONPATH by `replay record`: the recorded command's Python process imports
replay before its own code, and replay starts recording from REPLAY_CAPTURE (with the
REPLAY_CAPTURE_* options) at import. The sitecustomize this one shadows, if the environment has
one, runs first. Only the first Python process records: REPLAY_CAPTURE is taken out of the
environment its children inherit (a second process would find the snapshot taken). A
distributed launcher (torchrun, python -m torch.distributed.run) is the exception: it records
nothing and leaves REPLAY_CAPTURE to the ranks it starts, each of which records into
REPLAY_CAPTURE/rank-<r>/.
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


LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def _is_distributed_launcher() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own arguments: `-m` and the script
    if len(argv) > 1 and os.path.basename(argv[1]) == "torchrun":
        return True
    return any(word == "-m" and argv[i + 1] in LAUNCHERS for i, word in enumerate(argv[:-1]))


def _start_recording() -> None:
    if not os.environ.get("REPLAY_CAPTURE"):  # a child of the recorded process: nothing to load
        return
    if _is_distributed_launcher():  # its ranks record, each into a directory of its own
        return
    try:
        import replay  # noqa: F401 (starts recording from REPLAY_CAPTURE)
    except Exception as exc:  # the program runs all the same, unrecorded: say why
        print(f"replay record: could not start recording: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        os.environ.pop("REPLAY_CAPTURE", None)


_run_shadowed_sitecustomize()
_start_recording()
