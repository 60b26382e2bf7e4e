"""manifest.json: format version, producer environment, git state, notes."""
from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from pathlib import Path
from typing import Any

FORMAT_VERSION = 6  # the newest this tool reads, and what it writes
# Version 1: a file a call. Version 2: large tensors in chunks, each chunk a file of its own.
# Version 3: a tensor's new chunks packed into one file. Version 4: many calls to a file (segments).
# Version 5: an output buffer before the call as the elements the call left unchanged (unwritten.py).
# Version 6: a chunk list as the edits of an earlier whole list (chunk_lists.py).
PACKED_VERSION, SEGMENTED_VERSION, UNWRITTEN_VERSION, EDITED_LISTS_VERSION = 3, 4, 5, 6


def git_state(directory: Path) -> dict[str, Any] | None:
    """Commit and dirty flag of the git work tree holding `directory`, or None (both asked at once)."""
    queries = (["rev-parse", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])
    running: list[subprocess.Popen] = []
    try:
        for query in queries:
            running.append(subprocess.Popen(["git", "-C", str(directory), *query], stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True))
        answers = [process.communicate(timeout=10)[0].strip() for process in running]
        if any(process.returncode != 0 for process in running):
            return None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {"commit": answers[0], "dirty": bool(answers[1])}


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": "cpu"}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
    return env


def new_manifest(notes: str = "", source_dir: Path | None = None, *, with_git: bool = True) -> dict[str, Any]:
    """A manifest for a new snapshot; without `with_git` its git state is left None for the
    caller to fill in (two `git` runs cost a few milliseconds)."""
    return {
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "producer": {"git": git_state(source_dir or Path.cwd()) if with_git else None},
        "environment": environment(),
        "notes": notes,
        "capture_errors": [],
    }
