"""A Triton launch as a recorded call.

The call's op is the kernel's name (`package.module.kernel`), its variant "triton", its provider
the kernel's module. Its arguments are the kernel's parameters as bound for the launch (the
values an autotune config or heuristic chose included), tensors copied before the launch; the
tensors it writes through (replay/triton_launches/writes.py) are stored again after it, as
outputs; a pointer parameter named as runtime state (`position_buf`, ...) is the call's state.
The launch itself (grid, options such as num_warps, the config chosen, the stream, the compiled
kernel's details) is the call's `triton` field (docs/FORMAT.md); the kernel's source is stored
once per snapshot, by its hash.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton.language as tl

from replay.context import compiled_details, recorder_work
from replay.recorder.options import RecordingOptions
from replay.recorder.selection import Selection
from replay.recorder import cuda_streams
from replay.recorder.staging import CallSpec
from replay.snapshot import jsonargs
from replay.triton_launches import kernels

VARIANT = "triton"


class LaunchRecorder:
    """Turns the launches the door hands over into calls of `recording` (a replay.recorder Recording)."""

    def __init__(self, recording: Any, options: RecordingOptions):
        self.recording = recording
        self.selection = Selection(options)
        self.state_names = frozenset(options.state_names)
        self._sources: set[str] = set()  # source hashes stored in this snapshot
        # what a kernel's launches with the same tensor parameters share, worked out at the first (_Shape)
        # by the kernel's details (their identity: two kernels of one name and source may call other
        # helpers, which decide what they write), its parameters and its tensor parameters
        self._shapes: dict[tuple[int, tuple[str, ...], tuple[str, ...]], tuple[kernels.KernelInfo, _Shape]] = {}
        self._lock = threading.Lock()

    def launch(self, kernel: Any, original: Callable[..., Any], args: tuple, grid: Any, kwargs: dict,
               autotuner: Any) -> Any:
        """Launch `kernel` through Triton's own `original` run, recorded when the filter wants it."""
        def run_unrecorded() -> Any:
            return original(kernel, *args, grid=grid, warmup=False, **kwargs)
        try:
            info = self._wanted(kernel)
            if info is None:
                return self._let_pass(run_unrecorded)
            live = _bound(info, args, kwargs)  # the values launched
            options = {k: v for k, v in kwargs.items() if k not in live}
            grid = tuple(grid(live) if callable(grid) else grid)
            params = dict(live)  # the values recorded: a constexpr dtype (tl.float16) as its name
            shape = self._shape(info, params)
            described = self._describe(info, shape, params, options, grid, autotuner)
        except Exception as exc:  # recording never breaks the program: this launch goes unrecorded
            return self._unrecordable(kernel, exc, run_unrecorded)

        def launch_now() -> Any:
            launched = original(kernel, grid=grid, warmup=False, **live, **options)
            described["compiled"] = compiled_details(launched)
            return launched
        return self._record(info, shape, params, described, launch_now)

    def launch_compiled(self, launcher: Any, original: Callable[..., Any], args: tuple, stream: Any,
                        kwargs: dict) -> Any:
        """Launch a torch.compile kernel through Inductor's own `original` run (its CachingAutotuner's),
        recorded when the filter wants it. Inductor passes the kernel's non-constexpr parameters in
        order (then any arguments only its grid needs); the config it launched with (tuned on the
        first launch, inside `original`) gives the constexprs, warps, stages and grid, read after."""
        def run_unrecorded() -> Any:
            return original(launcher, *args, stream=stream, **kwargs)
        try:
            kernel = kernels.unwrap(launcher)
            info = self._wanted(kernel)
            if info is None:
                return self._let_pass(run_unrecorded)
            params = dict(zip(info.runtime_params, args))
            if len(params) != len(info.runtime_params):
                raise TypeError(f"{len(args)} arguments for parameters {', '.join(info.runtime_params)}")
            shape = self._shape(info, params)
            described = self._describe(info, shape, params, {}, (), None)
        except Exception as exc:
            return self._unrecordable(launcher, exc, run_unrecorded)

        def launch_now() -> Any:
            result = run_unrecorded()
            described.update(_compiled_launch(launcher, info, args, params))
            return result
        return self._record(info, shape, params, described, launch_now)

    def _wanted(self, kernel: Any) -> kernels.KernelInfo | None:
        """The kernel's details, or None when this launch is not to be recorded."""
        if self.recording.stopped:
            return None
        info = kernels.info_of(kernel)
        return info if self.selection.keeps(info.name) else None

    @staticmethod
    def _let_pass(run: Callable[[], Any]) -> Any:
        with recorder_work():  # a launch let pass: its operators are no calls either
            return run()

    def _unrecordable(self, kernel: Any, exc: Exception, run: Callable[[], Any]) -> Any:
        """Recording never breaks the program: a launch it cannot describe goes unrecorded."""
        name = getattr(getattr(kernels.unwrap(kernel), "fn", None), "__qualname__", repr(kernel))
        self.recording.report(f"kernel {name}: a launch could not be recorded: {type(exc).__name__}: {exc}",
                              stop=False)
        return run()

    def _record(self, info: kernels.KernelInfo, shape: _Shape, params: dict[str, Any],
                described: dict[str, Any], launch_now: Callable[[], Any]) -> Any:
        """Record the launch `launch_now` makes (the recorder runs it between its copies)."""
        launched: dict[str, Any] = {}

        def launch(**_: Any) -> None:
            launched["result"] = launch_now()

        spec = CallSpec(info.name, VARIANT, info.module, state=shape.state, mutates=shape.mutates,
                        write_only=shape.write_only, header_extra={"triton": described})
        self.recording.record(spec, launch, None, (), params)  # no signature: `params` are named in order
        return launched.get("result")

    def _shape(self, info: kernels.KernelInfo, params: dict[str, Any]) -> _Shape:
        """What this launch shares with the kernel's others that pass tensors for the same parameters."""
        tensors = tuple([n for n, v in params.items() if isinstance(v, torch.Tensor)])  # a list: no generator to resume
        key = (id(info), tuple(params), tensors)
        known = self._shapes.get(key)
        if known is not None and known[0] is info:  # held: its id names no other kernel's details meanwhile
            return known[1]
        shape = _Shape(
                state=tuple(n for n in tensors if n in self.state_names),
                mutates=tuple(n for n in tensors if n in info.written),
                write_only=tuple(n for n in tensors if n in info.write_only),
                constexprs=sorted(n for n in info.constexprs if n in params))
        self._shapes[key] = (info, shape)
        return shape

    def _describe(self, info: kernels.KernelInfo, shape: _Shape, params: dict[str, Any],
                  options: dict[str, Any], grid: tuple, autotuner: Any) -> dict[str, Any]:
        dtypes = {n: str(v) for n, v in params.items() if type(v) is tl.dtype}  # a scalar dtype, not a pointer
        params.update(dtypes)  # a constexpr dtype (tl.float16) travels as its name
        described: dict[str, Any] = {
            "qualname": info.qualname, "grid": [int(g) for g in grid],
            "options": {k: _json(v) for k, v in options.items()},
            "constexprs": list(shape.constexprs), "dtypes": dtypes, "write_only": sorted(shape.write_only),
            "source_sha256": self._store_source(info.name, info.source, info.source_sha256)}
        if info.generated:  # its module's text is the only way to run it again
            described["generated"] = True
            described["module_source_sha256"] = self._store_source(info.name, info.module_source,
                                                                   info.module_source_sha256)
        config = getattr(autotuner, "best_config", None)
        if config is not None:
            described["autotune"] = {k: _json(v) for k, v in getattr(config, "all_kwargs", dict)().items()}
        for value in params.values():  # the first tensor's device: the launch's
            if isinstance(value, torch.Tensor):
                if value.device.type == "cuda":
                    described["stream"] = cuda_streams.current(value.device).cuda_stream
                break
        return described

    def _store_source(self, kernel: str, text: str | None, digest: str | None) -> str | None:
        """Store `text` (whose sha256 is `digest`) once per snapshot; its digest."""
        if text is None or digest is None:
            return None
        if digest in self._sources:  # stored already: one set lookup a launch, no lock
            return digest
        with self._lock:
            known = digest in self._sources
            self._sources.add(digest)
        if not known:
            try:
                self.recording.writer.put_source(text)
            except OSError as exc:
                self.recording.report(f"kernel {kernel}: its source could not be stored: {exc}", stop=False)
        return digest


@dataclass(frozen=True)
class _Shape:
    """A kernel's parameters by role, for launches passing tensors for the same ones."""
    state: tuple[str, ...]  # pointers named as runtime state
    mutates: tuple[str, ...]  # pointers the kernel writes through
    write_only: tuple[str, ...]  # of those, the ones it never reads: output buffers
    constexprs: list[str]  # sorted, as the call's `triton` field lists them


def _compiled_launch(launcher: Any, info: kernels.KernelInfo, args: tuple,
                     params: dict[str, Any]) -> dict[str, Any]:
    """What an Inductor launch was made with, read from its CachingAutotuner after it: the config
    (one launcher once tuned; its first config under the interpreter, which compiles none), the
    constexprs that config and the kernel's constants gave (`config_args`, passed again on
    relaunch), the grid the config makes of the arguments, and the options that shaped the binary."""
    bound = launcher.launchers[0] if len(launcher.launchers) == 1 else None
    config = bound.config if bound is not None else launcher.configs[0]
    constants = {k: v for k, v in dict(launcher.triton_meta.get("constants", {})).items()
                 if k in info.constexprs and k not in params}
    config_args = {**constants, **{k: v for k, v in config.kwargs.items() if k in info.constexprs}}
    options = {k: v for k, v in launcher.triton_meta.items() if k in kernels.LAUNCH_OPTIONS}
    options.update(num_warps=config.num_warps, num_stages=config.num_stages)
    _, grid = launcher._interpret_args_grid(args, config)  # Inductor's own grid arithmetic
    return {"grid": [int(g) for g in grid], "options": {k: _json(v) for k, v in options.items()},
            "config_args": {k: _json(v) for k, v in config_args.items()},
            "autotune": {k: _json(v) for k, v in config.all_kwargs().items()},
            "compiled": compiled_details(getattr(bound, "bin", None))}


def _bound(info: kernels.KernelInfo, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The kernel's parameters by name, in order, defaults applied."""
    values = dict(zip(info.params, args))
    values.update({k: v for k, v in kwargs.items() if k in info.params})
    return {n: values[n] if n in values else info.defaults.get(n) for n in info.params
            if n in values or n in info.defaults}


def _json(value: Any) -> Any:
    try:
        return jsonargs.encode(value)
    except jsonargs.NotJSONRepresentable:
        return repr(value)
