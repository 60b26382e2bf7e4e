"""What the recorder and the replayer need to know of a Triton kernel, worked out once a kernel.

A kernel is the object `@triton.jit` made (a JITFunction, or under TRITON_INTERPRET=1 an
InterpretedFunction), possibly wrapped by `@triton.autotune` and `@triton.heuristics` (each of
which keeps the kernel it wraps as `.fn`). Its name is its module and qualified name; its source,
stored as data in the snapshot, is hashed so that two recordings can tell whether they ran the
same code. A kernel whose module no import by name finds again (written at run time, as
torch.compile's are) is `generated`: its whole module's text is stored too, the only way to run
it again (`replay run --trust-recorded-source`).
"""
from __future__ import annotations

import hashlib
import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from replay.triton_launches.writes import accessed_parameters

# what a launch may pass besides the kernel's parameters, and the type of each (Triton's options
# for NVIDIA and AMD GPUs that choose how a kernel is compiled and launched, nothing that names code)
LAUNCH_OPTIONS: dict[str, type] = {"num_warps": int, "num_stages": int, "num_ctas": int, "maxnreg": int,
                                   "enable_fp_fusion": bool, "launch_cooperative_grid": bool, "launch_pdl": bool,
                                   "debug": bool, "sanitize_overflow": bool,
                                   "waves_per_eu": int, "matrix_instr_nonkdim": int, "kpack": int}
GENERATED = "generated"  # the op names of generated kernels start so
_cache: dict[int, tuple[Any, "KernelInfo"]] = {}  # id(kernel) -> (kernel, info): kernels live as long as their module
_lock = threading.Lock()


@dataclass(frozen=True)
class KernelInfo:
    module: str
    qualname: str
    params: tuple[str, ...]
    defaults: dict[str, Any]
    constexprs: frozenset[str]
    source: str | None
    source_sha256: str | None
    written: frozenset[str]  # parameters a written pointer is computed from (writes.py)
    read: frozenset[str]  # parameters a loaded pointer is computed from
    generated: bool  # its module cannot be imported by name: written at run time
    module_source: str | None  # a generated kernel's whole module, the only way to run it again
    module_source_sha256: str | None

    @property
    def write_only(self) -> frozenset[str]:
        """Output buffers: written through, never read (what they held before is no input)."""
        return self.written - self.read

    @property
    def runtime_params(self) -> tuple[str, ...]:
        """The parameters passed at launch, in order: all but the constexprs."""
        return tuple(n for n in self.params if n not in self.constexprs)

    @property
    def name(self) -> str:
        """`package.module.kernel`: the op name its calls are recorded under. A generated kernel's
        module name is a cache key that changes with the code (torch.compile's
        `torch._inductor.runtime.compile_tasks.<hash>`), so it is `generated.kernel`: two
        recordings of a program before and after an edit still pair its launches (`replay diff`);
        the call's provider keeps the module."""
        return f"{GENERATED}.{self.qualname}" if self.generated else f"{self.module}.{self.qualname}"


def is_kernel(value: Any) -> bool:
    """A Triton JIT function, interpreted or compiled (not a wrapper around one)."""
    return type(value).__name__ in ("JITFunction", "InterpretedFunction") and inspect.isfunction(
        getattr(value, "fn", None))


def unwrap(value: Any) -> Any:
    """The kernel inside autotune and heuristics wrappers (each keeps what it wraps as `.fn`);
    None where there is none."""
    for _ in range(16):
        if is_kernel(value):
            return value
        value = getattr(value, "fn", None)
        if value is None:
            return None
    return None


def info_of(kernel: Any) -> KernelInfo:
    """The kernel's KernelInfo, worked out on its first launch."""
    found = _cache.get(id(kernel))
    if found is not None and found[0] is kernel:
        return found[1]
    info = _work_out(kernel.fn)
    with _lock:
        _cache[id(kernel)] = (kernel, info)
    return info


def _work_out(fn: Callable[..., Any]) -> KernelInfo:
    signature = inspect.signature(fn)
    try:
        source: str | None = inspect.getsource(fn)
    except (OSError, TypeError):  # made by exec, or its file is gone
        source = None
    written, read = accessed_parameters(fn, source)
    module = fn.__module__ or "__main__"  # exec'd without a __name__: found nowhere, like a script's
    generated = _generated(module)
    whole = _module_source(module) if generated else None
    return KernelInfo(
        module=module, qualname=fn.__qualname__, params=tuple(signature.parameters),
        defaults={n: p.default for n, p in signature.parameters.items() if p.default is not p.empty},
        constexprs=frozenset(n for n, p in signature.parameters.items() if _is_constexpr(p.annotation)),
        source=source, source_sha256=_sha256(source),
        written=written, read=read,
        generated=generated, module_source=whole, module_source_sha256=_sha256(whole))


def _sha256(text: str | None) -> str | None:
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else None


def _module_source(name: str) -> str | None:
    """The text of a module (a generated kernel's, with its imports and helpers)."""
    module = sys.modules.get(name)
    try:
        return inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        return None


def _generated(module: str) -> bool:
    """A module that no finder of the import system finds by name (torch.compile loads its kernels'
    modules from a cache directory by file name, some under a dotted name whose parent is no
    package). A program's own script (`__main__`) is not: its text is the program, never
    something to run again."""
    if module == "__main__":
        return False
    parent, _, _ = module.rpartition(".")
    path = None
    if parent:
        path = getattr(sys.modules.get(parent), "__path__", None)
        if path is None:  # its parent is no package (or not imported): nothing imports it by name
            return True
    for finder in sys.meta_path:  # editable installs and zip imports have finders of their own
        try:
            if getattr(finder, "find_spec", None) and finder.find_spec(module, path) is not None:
                return False
        except (ImportError, ValueError, AttributeError):
            continue
    return True


def _is_constexpr(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.split(".")[-1] == "constexpr"
    return getattr(annotation, "__name__", None) == "constexpr"
