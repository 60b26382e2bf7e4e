"""The door every Triton launch passes while a recording is active.

Triton launches a kernel through its object's `run(*args, grid, warmup, **kwargs)`: JITFunction.run
on a GPU, InterpretedFunction.run under TRITON_INTERPRET=1 (where nothing is compiled, so
`triton.knobs.runtime.launch_enter_hook` never fires). Both classes' `run` are replaced while a recording is
active and put back when it stops, so that one door serves both worlds and costs nothing when
no recording is. `@triton.autotune` and `@triton.heuristics` end in the kernel's `run`, with the
chosen config's values as arguments; the autotuner's benchmarking launches go through unrecorded
(Autotuner._bench is marked), and the config it chose is kept (Autotuner.run is marked).
A launch made inside a call already being recorded (a registered op's kernel) is that call's,
not one of its own.

torch.compile's kernels are launched by Inductor's CachingAutotuner.run, which on a GPU calls
the compiled binary itself and never reaches JITFunction.run; its `run` is replaced too, once the
program imports Inductor's runtime (after_import.py: importing it here would cost every program a
second). Under TRITON_INTERPRET=1 CachingAutotuner.run ends in the kernel's own `run`, which is
then part of the compiled launch's call.
"""
from __future__ import annotations

import contextvars
import functools
import threading
from typing import Any, Callable, Protocol

from replay.context import launches_wanted, recorder_kernel_running, recorder_work
from replay.triton_launches.after_import import when_imported
from replay.triton_launches.kernels import unwrap

_benchmarking: contextvars.ContextVar[bool] = contextvars.ContextVar("replay_autotune_bench", default=False)
_autotuner: contextvars.ContextVar[Any] = contextvars.ContextVar("replay_autotuner", default=None)
_lock = threading.Lock()
_replaced: dict[tuple[type, str], Callable[..., Any]] = {}  # (class, method) -> the original
_target: "LaunchTarget | None" = None
_stop_watching: Callable[[], None] = lambda: None
INDUCTOR_RUNTIME = "torch._inductor.runtime.triton_heuristics"


class LaunchTarget(Protocol):
    def launch(self, kernel: Any, original: Callable[..., Any], args: tuple, grid: Any, kwargs: dict,
               autotuner: Any) -> Any: ...

    def launch_compiled(self, launcher: Any, original: Callable[..., Any], args: tuple, stream: Any,
                        kwargs: dict) -> Any: ...


def install(target: LaunchTarget) -> None:
    """Send every Triton launch to `target` from now on (a recording's LaunchRecorder)."""
    global _target, _stop_watching
    with _lock:
        _target = target
        if _replaced:
            return
        for cls in _kernel_classes():
            _replace(cls, "run", _recorded_run)
        autotuner = _autotuner_class()
        if autotuner is not None:
            _replace(autotuner, "_bench", _marked(_benchmarking, lambda self: True))
            _replace(autotuner, "run", _marked(_autotuner, lambda self: self))
    _stop_watching = when_imported(INDUCTOR_RUNTIME, _replace_inductor_run)


def uninstall() -> None:
    """Put Triton's own methods back: launches cost what they cost before."""
    global _target
    _stop_watching()
    with _lock:
        _target = None
        for (cls, name), original in _replaced.items():
            setattr(cls, name, original)
        _replaced.clear()


def installed() -> bool:
    return bool(_replaced)


def _replace(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = cls.__dict__.get(name)
    if original is None:  # a Triton without it: that part of the door is missing, nothing breaks
        return
    _replaced[(cls, name)] = original
    setattr(cls, name, functools.wraps(original)(make(original)))


def _recorded_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        target = _target
        if target is None or recorder_kernel_running():  # the recorder's own kernels are no calls
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup or _benchmarking.get() or launches_wanted():  # not a call of its own
            with recorder_work():
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        autotuner = _autotuner.get()  # its config is this launch's only if it tunes this kernel (not a hook's)
        tuned = autotuner is not None and unwrap(autotuner) is self  # through @triton.heuristics too
        return target.launch(self, original, args, grid, kwargs, autotuner if tuned else None)
    return run


def _replace_inductor_run(module: Any) -> None:
    launcher = getattr(module, "CachingAutotuner", None)
    with _lock:
        if _target is not None and launcher is not None and (launcher, "run") not in _replaced:
            _replace(launcher, "run", _recorded_compiled_run)


def _recorded_compiled_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, stream: Any, benchmark_run: bool = False, **kwargs: Any) -> Any:
        target = _target
        if target is None:
            return original(self, *args, stream=stream, benchmark_run=benchmark_run, **kwargs)
        if benchmark_run or _benchmarking.get() or launches_wanted():  # not a call of its own
            with recorder_work():
                return original(self, *args, stream=stream, benchmark_run=benchmark_run, **kwargs)
        return target.launch_compiled(self, original, args, stream, kwargs)
    return run


def _marked(flag: contextvars.ContextVar[Any], value: Callable[[Any], Any]) -> Callable[..., Any]:
    """A method that runs with `flag` set to value(self) (the autotuner running, or benchmarking),
    as the recorder's own work: its hooks' and timing runs' tensor operators are not the program's."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = flag.set(value(self))
            try:
                with recorder_work():
                    return original(self, *args, **kwargs)
            finally:
                flag.reset(token)
        return marked
    return make


def _kernel_classes() -> list[type]:
    from triton.runtime.jit import JITFunction
    classes: list[type] = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:  # a Triton without the interpreter
        pass
    return classes


def _autotuner_class() -> type | None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return None
    return Autotuner
