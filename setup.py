"""Only what pyproject.toml cannot say: installing kernel-replay puts `kernel_replay.pth` in
site-packages, so that `REPLAY_CAPTURE=DIR python prog.py` records from the interpreter's start, as
`replay record` does (replay_autostart.py). A regular wheel carries it from the build folder; an
editable install (`pip install -e .`), whose wheel holds links to the source instead of a build
folder, gets it added to that wheel, with its line in the wheel's RECORD (so uninstalling removes it)."""
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().with_name("kernel_replay.pth")


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        shutil.copyfile(PTH, Path(self.build_lib, PTH.name))


class EditableWheelWithPth(editable_wheel):
    def run(self) -> None:
        super().run()
        for wheel in Path(self.dist_dir).glob("*.editable-*.whl"):
            _add_to_wheel(wheel, PTH)


def _add_to_wheel(wheel: Path, file: Path) -> None:
    """Write `wheel` again with `file` at its top; WheelFile writes a RECORD of every entry."""
    from wheel.wheelfile import WheelFile  # as setuptools' editable_wheel imports it

    with tempfile.TemporaryDirectory(dir=wheel.parent) as folder:
        rewritten = Path(folder, wheel.name)  # WheelFile reads its tags from the name
        with WheelFile(wheel) as source, WheelFile(rewritten, "w") as target:
            for item in source.infolist():
                if not item.filename.endswith(".dist-info/RECORD"):
                    target.writestr(item, source.read(item))
            target.write(str(file), file.name)
        rewritten.replace(wheel)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
