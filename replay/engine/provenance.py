"""Whether a snapshot's recorded outputs can hold bit for bit in this replay: the recording's
code and environment against the replaying ones.

Golden data is bitwise by default, and bits follow the device, the torch and Triton versions
and the kernel code. When any of those differs from the recording, `replay run --golden-data`
says so once, before its verdict, so that a divergence is read for what it may be.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable

from replay.snapshot.manifest import environment

# what decides the bits of a kernel's output, besides its code
ENVIRONMENT_KEYS = ("device", "torch", "triton")


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30)


def code_differences(commit: str | None, dirty: bool, code_paths: Iterable[Path]) -> list[str]:
    """Why the code at `code_paths` (the providers' package directories, or module files) may not be
    the code recorded at `commit`: changed or new (untracked) files since."""
    if not commit:
        return ["the snapshot records no git commit"]
    found = []
    if dirty:
        found.append(f"it was recorded from a work tree with uncommitted changes (commit {commit[:10]})")
    for code in sorted(set(code_paths)):
        where, name = (code, ".") if code.is_dir() else (code.parent, code.name)
        shown_as = f"{code.name}/" if code.is_dir() else code.name
        try:
            if _git(where, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
                found.append(f"{code} is not in a git repository holding the recorded commit {commit[:10]}")
                continue
            changed = _git(where, "diff", "--name-only", "--relative", commit, "--", name).stdout.split()
            changed += _git(where, "ls-files", "--others", "--exclude-standard", "--", name).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            found.append(f"git could not compare {code} with commit {commit[:10]}: {exc}")
            continue
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            found.append(f"{shown_as} changed since the recorded commit {commit[:10]} ({shown})")
    return found


def environment_differences(recorded: dict[str, Any], replay_device: str) -> list[str]:
    """The recorded environment's device and versions that this replay's do not match."""
    current = environment()
    if replay_device == "cpu":
        current["device"] = "cpu"
    return [f"{key} {recorded.get(key)} then, {current.get(key)} now" for key in ENVIRONMENT_KEYS
            if recorded.get(key) != current.get(key)]


def golden_warning(manifest: dict[str, Any], replay_device: str, code_paths: Iterable[Path],
                   tolerance_given: bool = False) -> str | None:
    """One line saying why recorded outputs may not hold bit for bit here, or None when nothing differs."""
    git = (manifest.get("producer") or {}).get("git") or {}
    reasons = environment_differences(manifest.get("environment") or {}, replay_device)
    reasons += code_differences(git.get("commit"), bool(git.get("dirty")), code_paths)
    if not reasons:
        return None
    advice = "record the snapshot again here" if tolerance_given else "use --atol/--rtol, or record the snapshot again here"
    return f"golden data may not hold bit for bit: {'; '.join(reasons)} ({advice})"
