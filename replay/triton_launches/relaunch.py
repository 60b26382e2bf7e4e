"""A recorded Triton launch as an op the replay engine runs: the kernel found again in trusted code
and launched on fresh copies of the recorded arguments, with the recorded grid, options and config.

The op has one variant, "triton" (the launch), and a "reference" where the user named one for the
kernel (`replay.reference_for`); what the launch writes is compared with what the recording
stored after it, bitwise unless a tolerance is given. The kernel is imported by the module and
qualified name the snapshot names, under the provider trust rule (replay/code.py): a snapshot
never picks the code that runs.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from replay.code import KernelCode
from replay.errors import ReplayError, SnapshotError, UntrustedProviderError
from replay.registry import REFERENCE, Op
from replay.snapshot import CallRecord
from replay.tolerance import DEFAULT, EXACT, Tolerance
from replay.triton_launches import kernels
from replay.triton_launches.recording import VARIANT

_references: dict[str, Callable[..., Any]] = {}  # kernel name -> the user's reference for it
class KernelNotFound(ReplayError):
    """This code has no kernel to make a recorded launch with: the call is untestable (exit 125)."""


def reference_for(kernel: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator naming `fn` the reference of the Triton kernel called `kernel` (`package.module.name`):
    replaying a recorded launch of it also runs `fn` on the same arguments, and what `fn` writes
    into the kernel's output tensors is compared with what the kernel wrote.

    Example:
        @replay.reference_for("mylib.ops.scale_kernel")
        def scale_reference(x_ptr, out_ptr, n, factor, BLOCK):
            out_ptr.copy_(x_ptr * factor)
    """
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _references[kernel] = fn
        return fn
    return register


def op_for(code: KernelCode, record: CallRecord, where: str, tolerance: Tolerance | None = None,
           recorded_source: Callable[[str], str] | None = None) -> Op:
    """The op that replays the launch `record` (a call with a `triton` field): KernelNotFound when
    the kernel is not in this code or no longer takes the recorded arguments. A kernel generated
    at record time (torch.compile's) runs from the module text the snapshot stores, read through
    `recorded_source` (given only when the user trusts it: --trust-recorded-source)."""
    launch = record.triton or {}
    module, qualname = record.provider or "", str(launch.get("qualname", ""))
    options = _checked_options(launch.get("options", {}), where)
    if launch.get("generated"):
        found = _recorded_module(module, launch, where, recorded_source)
    else:
        code.import_provider(module, where)
        try:
            found = sys.modules.get(module) or importlib.import_module(module)
        except ImportError as exc:
            raise KernelNotFound(f"kernel {record.op}: module '{module}' is not in this code ({exc})") from None
    kernel = kernels.unwrap(_attribute(found, qualname))
    if kernel is None:
        raise KernelNotFound(f"kernel {record.op}: module '{module}' has no Triton kernel '{qualname}' in this code")
    info = kernels.info_of(kernel)
    params = info.params
    recorded = [a["name"] for a in record.args]
    unknown = [n for n in recorded if n not in params]
    if unknown:
        raise KernelNotFound(f"kernel {record.op} no longer takes the recorded arguments: it has no parameter "
                             f"{', '.join(repr(n) for n in unknown)} (it takes {', '.join(params)})")
    config_args = _config_args(launch, info, recorded, where)
    outputs = tuple(n for n in record.role("out") if n in recorded)
    op = Op(record.op, module, state=tuple(record.role("state")), mutates=outputs,
            # a kernel's rows: its outputs' leading axis (a vector's would be its elements)
            batch_axes={name: 0 for name, value in record.role("out").items() if name in outputs and value.dim() > 1},
            tolerance={dtype: tolerance for dtype in DEFAULT} if tolerance else {}, rerun_tolerance=tolerance or EXACT)
    op.variant(VARIANT)(_relaunch(kernel, launch, {**options, **config_args}, _dtypes(launch, where)))
    reference = _references.get(record.op)
    if reference is not None:
        op.variant(REFERENCE)(reference)
    return op


def _recorded_module(module: str, launch: dict[str, Any], where: str,
                     recorded_source: Callable[[str], str] | None) -> ModuleType:
    """The generated module a launch's kernel came from, made again from the text the snapshot
    stores (its hash checked by the reader), in a file of its own so that Triton can read it."""
    digest = launch.get("module_source_sha256")
    if recorded_source is None:
        raise UntrustedProviderError(
            f"{where}: kernel {launch.get('qualname')} was generated when recorded (its module '{module}' "
            "cannot be imported); the snapshot holds its source, which is code: run it with --trust-recorded-source "
            "(replay run only: that source is the recording's, the same at every commit, so bisect cannot test it; "
            "bisect such a program with --run, recording it again at each commit)")
    if not isinstance(digest, str):
        raise KernelNotFound(f"kernel {launch.get('qualname')}: generated, and its module's source was "
                             "not recorded")
    text = recorded_source(digest)  # read (and its hash checked) every time: the snapshot may have changed
    name = f"replay_recorded_{digest[:16]}"
    if name not in sys.modules:
        folder = tempfile.mkdtemp(prefix="replay-recorded-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # Triton reads the file while it runs
        path = Path(folder) / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        made = importlib.util.module_from_spec(spec)
        sys.modules[name] = made
        try:
            spec.loader.exec_module(made)
        except Exception as exc:  # the recorded text is code: whatever it raises, it does not build here
            del sys.modules[name]
            raise KernelNotFound(f"kernel {launch.get('qualname')}: its recorded source does not run "
                                 f"here: {type(exc).__name__}: {exc}") from None
    return sys.modules[name]


def _attribute(module: Any, qualname: str) -> Any:
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)  # '<locals>': a kernel defined in a function is not found
        if found is None:
            return None
    return found


def _checked_options(options: Any, where: str) -> dict[str, Any]:
    """The launch options a relaunch passes on: only those that tune how the kernel is compiled
    and run (an option such as `ir_override` would let a snapshot choose the device code)."""
    unknown = sorted(set(options) - set(kernels.LAUNCH_OPTIONS))
    if unknown:
        raise SnapshotError(f"{where}: launch option(s) {', '.join(map(repr, unknown))} are not relaunched "
                            f"(replay passes on only {', '.join(kernels.LAUNCH_OPTIONS)})")
    wrong = [k for k, v in options.items() if not isinstance(v, kernels.LAUNCH_OPTIONS[k]) or isinstance(v, bool) is not
             (kernels.LAUNCH_OPTIONS[k] is bool)]
    if wrong:
        raise SnapshotError(f"{where}: launch option(s) {', '.join(map(repr, wrong))} have values of the wrong type")
    return dict(options)


def _config_args(launch: dict[str, Any], info: kernels.KernelInfo, recorded: list[str],
                 where: str) -> dict[str, Any]:
    """The constexprs a torch.compile launcher supplied from its config (`config_args`): only the
    kernel's own constexpr parameters, as plain values, none the call's arguments already give."""
    given = launch.get("config_args") or {}
    if not isinstance(given, dict):
        raise SnapshotError(f"{where}: config_args is not an object")
    wrong = sorted(n for n, v in given.items() if n not in info.constexprs or n in recorded
                   or not isinstance(v, (int, float, bool, str)))
    if wrong:
        raise SnapshotError(f"{where}: config_args {', '.join(map(repr, wrong))} are not constexpr parameters of "
                            f"{info.name} given as plain values")
    return dict(given)


def _dtypes(launch: dict[str, Any], where: str) -> dict[str, Any]:
    """The constexpr dtypes the launch recorded by name (tl.float16 as "fp16"), made again."""
    import triton.language as tl

    made = {}
    for name, text in dict(launch.get("dtypes", {})).items():
        try:
            made[name] = tl.dtype(text)
        except (AssertionError, ValueError, TypeError, KeyError):
            raise SnapshotError(f"{where}: argument {name!r}: {text!r} is no Triton dtype") from None
    return made


def _relaunch(kernel: Any, launch: dict[str, Any], options: dict[str, Any],
              dtypes: dict[str, Any]) -> Callable[..., None]:
    grid = tuple(int(g) for g in launch.get("grid", ()))

    def relaunch(**values: Any) -> None:
        kernel[grid](**{**values, **dtypes}, **options)
    return relaunch
