"""What the wheel installs: every package of the repository, and no top-level `kernels`, so that
kernel-replay and Hugging Face's `kernels` (which transformers imports for hub kernels) can live
in one environment. The bundled kernels install as `replay_kernels`."""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_AS = {"replay": "replay", "kernels": "replay_kernels"}  # repository folder -> import name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # one build at a time across pytest-xdist's workers: two at once in the repository race on its
    # build/ and egg-info folders ("Building wheel ... did not run successfully")
    with open(tmp_path_factory.getbasetemp().parent / "wheel-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                               "-w", str(out), str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("kernel_replay-*.whl")
    return built


def repository_packages() -> set[str]:
    found = set()
    for folder, name in INSTALLED_AS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    return found


def test_the_wheel_holds_every_package_and_no_top_level_kernels(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {Path(n).parent.as_posix().replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packaged == repository_packages()  # a package folder missing from pyproject.toml fails here
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"replay", "replay_kernels", "replay_launcher.py", "replay_autostart.py", "kernel_replay.pth"}
    assert {"replay/py.typed", "replay/snapshot/format.schema.json", "replay/bootstrap/sitecustomize.py"} <= set(names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "replay_kernels = replay_kernels" in text and "replay_kernels.kv_adapter:tiny" in text


def test_hugging_face_kernels_and_kernel_replay_import_side_by_side(wheel: Path, tmp_path: Path) -> None:
    assert importlib.util.find_spec("kernels") is not None, \
        "Hugging Face's kernels is in the test extra: pip install -e '.[test]'"
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # a fresh process outside the repository (no kernels/ folder on its path), the wheel first
    probe = ("import json, kernels, replay, replay_kernels\n"
             "from importlib.metadata import entry_points\n"
             "print(json.dumps({'hf': kernels.__file__, 'get_kernel': callable(getattr(kernels, 'get_kernel', None)),"
             " 'replay': replay.__file__, 'ours': replay_kernels.__file__, 'ops': sorted(replay_kernels.OPS),"
             " 'rmsnorm': replay.get_op('rmsnorm').name,"
             " 'providers': sorted(e.value for e in entry_points(group='replay.providers'))}))\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"})
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["get_kernel"] and str(target) not in seen["hf"]  # Hugging Face's package, untouched
    assert seen["replay"].startswith(str(target)) and seen["ours"].startswith(str(target))
    assert "rmsnorm" in seen["ops"] and seen["rmsnorm"] == "rmsnorm"
    assert "replay_kernels" in seen["providers"]


def test_the_wheel_starts_a_recording_from_replay_capture_in_the_site_it_is_installed_in(
        wheel: Path, tmp_path: Path) -> None:
    """Its kernel_replay.pth, listed in its RECORD (uninstalling removes it), runs where Python
    reads a site folder: with REPLAY_CAPTURE set, that loads replay, which starts the recording."""
    names = zipfile.ZipFile(wheel).namelist()
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    assert "kernel_replay.pth," in zipfile.ZipFile(wheel).read(record).decode()
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # -S: no site folder read at start (this environment's own kernel_replay.pth would start the
    # recording first); then the wheel's folder, and after it the one holding torch, as a venv's
    # system site-packages come after its own: the recording starts only when site looks for
    # sitecustomize, every folder added
    packages = [p for p in sys.path if p.endswith("site-packages")]
    probe = ("import os, site, sys\n"
             f"site.addsitedir({str(target)!r})\n"
             "early = 'replay' in sys.modules\n"
             f"for folder in {packages!r}:\n"
             "    site.addsitedir(folder)\n"
             "try:\n"
             "    import sitecustomize\n"  # as site.main() does last
             "except ImportError:\n"
             "    pass\n"
             "replay = sys.modules.get('replay')\n"
             "print(early, replay is not None and replay.__file__, os.environ.get('REPLAY_CAPTURE'))\n"
             "import torch, replay\n"
             "replay.capture('noted')(lambda x: x + 1)(torch.zeros(2))\n")  # a call: the snapshot is kept
    ran = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "REPLAY_CAPTURE": "snap"})
    assert ran.returncode == 0, ran.stderr
    early, loaded, left = ran.stdout.split()
    assert early == "False" and loaded.startswith(str(target)) and left == "None", ran.stdout
    assert (tmp_path / "snap" / "manifest.json").exists()  # the recording, written out at exit
