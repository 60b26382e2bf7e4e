"""kernel-replay: record kernel calls, replay them against variants, bisect regressions.

    import replay

    rmsnorm = replay.op("rmsnorm", batch_axes={"x": 0, "out": 0})

    @rmsnorm.batched
    def rmsnorm_batched(x, weight, eps=1e-6): ...

    with replay.recording("snapshots/my_run"):
        model.prefill(tokens)

REPLAY_CAPTURE=path records the whole process, from its start where kernel-replay is installed
(replay_autostart.py), else from import on; REPLAY_VERIFY=op1,op2@0.05 checks a share of those
ops' calls against their references (replay.verify).

On a machine with no GPU, importing replay sets TRITON_INTERPRET=1 (unless it is set), so that
Triton kernels defined after it run in Triton's interpreter on CPU tensors.
"""
from __future__ import annotations

from replay import settings
from replay.device import use_interpreter_without_gpu

use_interpreter_without_gpu(warn_if_late=True)

from replay.kernel_rules import KernelRules
from replay.launches import launch
from replay.recorder import dump, flush, recapture_needed, recording
from replay.context import launches_wanted, record_launch, scope, step, tag
from replay.registry import Op, capture, get_op, op
from replay.tolerance import Tolerance
from replay.triton_launches.relaunch import reference_for
from replay.verify import verify

__all__ = ["KernelRules", "Op", "Tolerance", "capture", "dump", "flush", "get_op", "launch", "launches_wanted", "op",
           "recapture_needed", "record_launch", "recording", "reference_for", "scope", "step", "tag", "verify"]

if settings.CAPTURE.is_set:
    from replay.recorder import start_from_env

    start_from_env()
if settings.VERIFY.is_set:
    from replay.verify import from_env

    from_env()
