"""kernel-replay: record kernel calls, replay them against variants, bisect regressions."""
from replay import recorder as _recorder
from replay.recorder import launch, recording, tag
from replay.registry import Tolerance, capture, get_op, op

__all__ = ["capture", "get_op", "launch", "op", "recording", "tag", "Tolerance"]

_recorder.start_from_env()
