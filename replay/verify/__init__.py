"""`replay.verify`: check a sampled share of a kernel's calls, and every unusual one, against its
reference while the program runs; a mismatch becomes a snapshot that `replay run` replays.

    @replay.verify(reference=matmul_fp64, sample=0.01, rtol=1e-2, atol=1e-3)
    def my_matmul(x, w): ...

    replay.verify("rmsnorm", sample=0.05)      # a registered op: reference and tolerance its own
    REPLAY_VERIFY=rmsnorm,q4k_gemv@0.05        # the same without code changes

docs/VERIFY.md says how calls are chosen (sampling and the outlier gate), what it costs, and
where it stays out of the way (torch.compile, CUDA graph capture, threads, shutdown).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from replay import metrics, recorder, settings
from replay.errors import ReplayError
from replay.registry import REFERENCE, Op, all_ops, declaration, get_op, import_path, op as declare_op
from replay.tolerance import Tolerance
from replay.verify.verifier import COMPILE_MODES, VERIFIER, Mismatch, Policy

log = logging.getLogger(__name__)

__all__ = ["Mismatch", "verify"]

_policies: dict[str, Policy] = {}


def verify(target: Callable[..., Any] | str | None = None, /, reference: Callable[..., Any] | None = None, *,
           sample: float = 0.01, rtol: float | None = None, atol: float | None = None,
           on_mismatch: Callable[[Mismatch], None] | None = None, outliers: bool | float = True,
           metric: str | None = None) -> Any:
    """Verify calls against a reference, off the critical path.

    Args:
        target: a registered op's name (its variants are verified wherever they are called, with
            its reference and tolerance), or the function to decorate.
        reference: for a function that is no op's variant: the function it must agree with.
        sample: the share of calls checked, chosen at random (0 to 1).
        rtol, atol: for a function given a reference: the tolerance (either given, the other is
            0; neither, replay.tolerance.DEFAULT for each dtype).
        on_mismatch: called with a Mismatch (op, call, output, rows, max error, snapshot path)
            instead of printing one line on stderr.
        outliers: also check the calls after one whose inputs look unlike the calls before (the
            gate). True: the gate reads every call while the gates together cost the program
            less than their budget (configure's gate_budget, 2% of its time), else that many
            fewer, chosen at random, as each measures its cost. A number from 0 to 1 is the
            share of calls the gate reads, whatever it costs (1.0: every call): its cost to the
            program falls in proportion, and a pattern that recurs is seen that many calls later
            on average.
        metric: for a function given a reference: how a check passes instead of within the
            tolerance ('nmse:1e-6', 'cosine:0.9999', ...: replay/metrics.py; decided on the device
            where it can be, ulp on the worker's host; not fp64, which needs a float64 run). A
            registered op's own metric comes from replay.op.

    Returns:
        With an op's name, None; as a decorator, the function, wrapped.

    Example:
        @replay.verify(reference=lambda x, w: (x.double() @ w.double()).float(), sample=0.01)
        def fast_matmul(x, w): ...
    """
    if isinstance(target, str):
        _enable(get_op(target), sample, on_mismatch, outliers)
        return None

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = getattr(fn, "__replay_spec__", None)
        if spec is not None and reference is None:
            _enable(get_op(spec.op), sample, on_mismatch, outliers)
            return fn
        if reference is None:
            raise ValueError(f"replay.verify: {fn.__qualname__} is no op's variant: give it a reference")
        declared = _declare(fn, reference, rtol, atol, metric)
        _enable(declared, sample, on_mismatch, outliers)
        return declared.variants["default"].call
    return decorate(target) if callable(target) else decorate


def _declare(fn: Callable[..., Any], reference: Callable[..., Any], rtol: float | None,
             atol: float | None, metric: str | None) -> Op:
    """An op of its own for a plain function and its reference, so that a mismatch replays: from
    the function's module where that declares it (the decorator written there), else from what
    its calls record (`declared`: where the function and the reference can be imported)."""
    name = fn.__qualname__ if fn.__qualname__ not in all_ops() else f"{fn.__module__}.{fn.__qualname__}"
    tolerance = None if rtol is None and atol is None else Tolerance(rtol=rtol or 0.0, atol=atol or 0.0)
    if metric is not None and metrics.parse(metric).needs_float64_run:
        raise ValueError(f"replay.verify: metric {metric!r} cannot be decided from the two outputs (it needs a "
                         "float64 run of the reference): use it with replay run")
    if fn.__module__ == "__main__":  # `replay run` imports an op's module: a script's is no module to import
        log.warning(f"replay.verify: {fn.__qualname__} is defined in the script being run (__main__): its mismatch "
                    "snapshots replay once it lives in a module that `replay run --provider MODULE` can import")
    declared = declare_op(name, tolerance=tolerance, provider=fn.__module__, metric=metric)
    function, reference_path = import_path(fn), import_path(reference)
    if function is not None and reference_path is not None:  # a replay can declare it again, reference included
        declared.declared = declaration({"default": function, REFERENCE: reference_path}, tolerance=tolerance,
                                        metric=metric)
    declared.variant("default")(fn)
    declared.reference(reference)
    return declared


def _enable(op: Op, sample: float, on_mismatch: Callable[[Mismatch], None] | None,
            outliers: bool | float) -> Callable[..., Any]:
    """Verify `op`'s calls from now on; returns the hook its calls go through."""
    if op.name in _policies:
        VERIFIER.retire(_policies[op.name])
    policy = _policies[op.name] = Policy(op, sample, on_mismatch, outliers)
    hook = VERIFIER.hook(policy)
    recorder.set_verifier(op.name, hook)
    return hook


def configure(*, enabled: bool | None = None, sample: float | None = None, directory: str | Path | None = None,
              max_snapshots: int | None = None, compile: str | None = None, seed: int | None = None,
              max_pending_bytes: int | None = None, gate_budget: float | None = None) -> None:
    """Change verification at run time: on or off, every verified op's sampling rate, where
    mismatch snapshots go and how many per op, what happens under torch.compile ("break": a
    graph break around the check; "skip": no check in compiled code, counted when traced), how
    much memory pending checks may hold before calls go unchecked (dropped), and the share of the
    program's time the outlier gates of ops verified with outliers=True may take together
    (gate_budget, 0.02 by default: they read fewer calls where reading every one would cost more)."""
    settings = VERIFIER.settings
    if compile is not None and compile not in COMPILE_MODES:
        raise ValueError(f"replay.verify.configure: compile={compile!r}: one of {', '.join(COMPILE_MODES)}")
    if max_pending_bytes is not None and (isinstance(max_pending_bytes, bool) or not isinstance(max_pending_bytes, int)
                                          or max_pending_bytes < 1):
        raise ValueError(f"replay.verify.configure: max_pending_bytes={max_pending_bytes!r}: a positive number of "
                         "bytes")
    if sample is not None and not 0.0 <= sample <= 1.0:
        raise ValueError(f"replay.verify.configure: sample={sample!r} must be a share of calls, 0 to 1")
    if gate_budget is not None and (isinstance(gate_budget, bool) or not isinstance(gate_budget, (int, float))
                                    or not 0.0 < gate_budget <= 1.0):
        raise ValueError(f"replay.verify.configure: gate_budget={gate_budget!r} must be a share of the program's "
                         "time, above 0 and at most 1")
    if enabled is not None:
        settings.enabled = enabled
    if sample is not None:
        for policy in _policies.values():
            VERIFIER.schedule(policy, policy.calls() - 1, sample)
    if directory is not None:
        settings.directory = Path(directory)
    if max_snapshots is not None:
        settings.max_snapshots = max_snapshots
    if compile is not None:
        settings.compile = compile
    if max_pending_bytes is not None:
        settings.max_pending_bytes = max_pending_bytes
    if gate_budget is not None:
        settings.gate_budget = float(gate_budget)
    if seed is not None:
        VERIFIER.seed(seed)


def counters() -> dict[str, int]:
    """Calls seen, checked, flagged by the gate, skipped (compiled or graph capture), dropped (the
    pending checks were too many, or held too much memory), failed (mismatches), snapshots
    written, abandoned at exit, unscored by the gate (its buffers all busy)."""
    return VERIFIER.counts()


def drain(timeout: float = 10.0) -> int:
    """Let the gate decide on every call so far, and wait up to `timeout` seconds for pending
    checks; return how many are still pending (they go on)."""
    return VERIFIER.drain(timeout)


def stop(op_name: str) -> None:
    """No longer verify `op_name`."""
    policy = _policies.pop(op_name, None)
    recorder.set_verifier(op_name, None)
    if policy is not None:
        VERIFIER.retire(policy)


def from_env() -> None:
    """REPLAY_VERIFY=op1,op2@0.05: verify those registered ops (0.01 where no rate is given);
    ops registered later are picked up at their first call. A malformed entry is reported on
    stderr and skipped: the program runs."""
    for entry in filter(None, (e.strip() for e in settings.VERIFY.get().split(","))):
        name, _, rate = entry.partition("@")
        try:
            sample = float(rate) if rate else 0.01
            if not 0.0 <= sample <= 1.0:
                raise ValueError
        except ValueError:
            log.warning(f"replay.verify: REPLAY_VERIFY entry {entry!r}: the rate must be a share of calls, 0 to 1; "
                        "skipped")
            continue
        recorder.set_verifier(name, _lazy(name, sample))


def _lazy(name: str, sample: float) -> Callable[..., Any]:
    """A hook that makes the op's policy at its first call, when the op surely exists; an op that
    cannot be verified (no reference) is reported once and left alone."""
    def first_call(spec: Any, call: Callable[..., Any], signature: Any, args: tuple, kwargs: dict) -> Any:
        try:
            hook = _enable(get_op(name), sample, None, True)
        except (ValueError, ReplayError) as exc:
            log.warning(f"replay.verify: REPLAY_VERIFY: {exc}; not verified")
            recorder.set_verifier(name, None)
            return call(*args, **kwargs)
        return hook(spec, call, signature, args, kwargs)
    return first_call


verify.configure = configure  # type: ignore[attr-defined]
verify.counters = counters  # type: ignore[attr-defined]
verify.drain = drain  # type: ignore[attr-defined]
verify.stop = stop  # type: ignore[attr-defined]
