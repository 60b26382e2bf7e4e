"""Recording from a Python process's first line, where REPLAY_CAPTURE is set.

Two doors lead here before the program's own code runs: the `kernel_replay.pth` file that
installing kernel-replay puts in site-packages (any `REPLAY_CAPTURE=DIR python prog.py` in that
environment: start_after_site), and the sitecustomize that `replay record` puts first on
PYTHONPATH (a command whose Python is another environment's: start). Kept outside the `replay`
package, whose import starts the recording: this module decides first whether this process is the
one to record, so that a Python process without REPLAY_CAPTURE pays one environment lookup and
nothing more.

Only the first Python process records: REPLAY_CAPTURE is taken out of the environment its
children inherit (a second process would find the snapshot taken). A distributed launcher
(torchrun, python -m torch.distributed.run) is the exception: it records nothing and leaves
REPLAY_CAPTURE to the ranks it starts, each of which records into REPLAY_CAPTURE/rank-<r>/. A
process started through the .pth that records no call at all (a `pip` or a helper script run
with REPLAY_CAPTURE exported) leaves no snapshot behind, so that the program the variable was
meant for still finds the directory free.
"""
import atexit
import contextlib
import os
import shutil
import sys

LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def start_after_site() -> None:
    """From kernel_replay.pth, while the interpreter's site is still adding folders to sys.path
    (a later one, a venv's system site-packages or the user's, may hold torch): the recording
    starts when site looks for `sitecustomize`, which it does once every folder is added."""
    if os.environ.get("REPLAY_CAPTURE"):
        sys.meta_path.insert(0, _AtSitecustomize())


class _AtSitecustomize:
    """A finder that finds nothing: the first look for `sitecustomize` starts the recording."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "sitecustomize":
            with contextlib.suppress(ValueError):  # once
                sys.meta_path.remove(self)
            start("REPLAY_CAPTURE", from_site=True)


def start(door: str = "REPLAY_CAPTURE", from_site: bool = False) -> None:
    """Start recording into REPLAY_CAPTURE, if it is set and this process is not a distributed
    launcher; a failure is said on stderr, prefixed by `door`, and the program runs unrecorded.
    `from_site` (the .pth's door): where replay cannot be imported, REPLAY_CAPTURE stays set for
    an import the program makes itself; a recording of no call is taken back at exit."""
    target = os.environ.get("REPLAY_CAPTURE")
    if not target or _is_distributed_launcher():
        return
    existed = os.path.exists(target)
    try:
        import replay  # noqa: F401 (starts recording from REPLAY_CAPTURE)
    except Exception as exc:  # the program runs all the same, unrecorded: say why
        print(f"{door}: could not start recording: {type(exc).__name__}: {exc}", file=sys.stderr)
        if from_site:
            return
    os.environ.pop("REPLAY_CAPTURE", None)
    if from_site and not existed and not _under_replay_record():
        # after replay's own: atexit runs it first; where it was made (a program may change directory)
        atexit.register(_take_back_if_empty, os.path.abspath(target))


def _under_replay_record() -> bool:
    """Whether `replay record` started this process (its bootstrap first on the path): the
    snapshot it was asked for is kept, calls or none, for it to report on."""
    import replay

    bootstrap = os.path.join(os.path.dirname(os.path.abspath(replay.__file__)), "bootstrap")
    return any(os.path.abspath(entry or os.curdir) == bootstrap for entry in sys.path)


def _take_back_if_empty(target: str) -> None:
    """Stop the recording this process started into `target` (absolute), a new directory, and
    remove it where it holds no call and no capture error (a flight recording's and a rank's stay)."""
    from replay.recorder import lifecycle

    rec = lifecycle.active()
    if rec is None or rec.ring is not None or os.path.abspath(rec.path) != target:
        return
    lifecycle.stop()
    if rec.calls_written == 0 and not rec.writer.manifest.get("capture_errors"):  # as written at close
        shutil.rmtree(target, ignore_errors=True)


def _is_distributed_launcher() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own arguments: `-m` and the script
    if len(argv) > 1 and os.path.basename(argv[1]) == "torchrun":
        return True
    return any(word == "-m" and argv[i + 1] in LAUNCHERS for i, word in enumerate(argv[:-1]))
