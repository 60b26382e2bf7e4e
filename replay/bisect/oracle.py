"""What a bisect probe holds each commit to, chosen so that the two ends of the range differ.

A snapshot is usually recorded where the bug was seen: at the bad end. Its recorded outputs are
then the bug's, and no oracle: every older commit would differ from them. So by default (`auto`)
a commit is held to what needs no recording of outputs, the **reference** oracle: each variant
against the op's reference, single against batched, and the op's contracts (`replay run
--oracle reference`). Where both ends pass that (a bug inside the reference's tolerance, a
constant folded to another value), the **good end** itself is the oracle: its outputs on the
recorded inputs, kept by a probe there (`--save-outputs`) and compared bit for bit (`--golden-data
DIR`); it is run twice first, and where its bits differ run to run, a tolerance of a few times that
spread is used, and said. `recorded` holds each commit to the snapshot's own outputs, bit for bit,
for a snapshot recorded at the good end.

The ends are probed first under the chosen oracle: a good end that fails it, or a bad end that
passes it, is an error naming the oracle (exit 2), as is an end that cannot be tested.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.bisect.probe import ProbeCommand
from replay.bisect.parallel import Prober
from replay.bisect.result import ProbeRecord
from replay.bisect.search import BAD, GOOD, SKIP
from replay.bisect.steps import Step, StepHandler
from replay.errors import BisectError

ORACLES = ("auto", "reference", "good-end", "recorded")
REFERENCE_OPTIONS = ("--oracle", "reference")
SPREAD_FACTOR = 4  # a good end that differs from itself by d is compared within SPREAD_FACTOR * d


@dataclass(frozen=True)
class Oracle:
    name: str
    command: ProbeCommand  # what each commit in the range is probed with
    note: str  # said in the report


def choose(requested: str, prober: Prober, snapshot: Path | None, options: tuple[str, ...], shell: str | None,
           good: str, bad: str, emit: StepHandler) -> Oracle:
    """Probe the ends and return the oracle that tells them apart; BisectError when none does."""
    if shell is not None:
        if requested != "auto":
            raise BisectError(f"--oracle {requested}: applies to the replay probe, not to --run")
        command = ProbeCommand.shell(shell, snapshot)
        oracle = Oracle("exit code", command, f"the exit code of `{shell}`")
        return _held(oracle, prober.probe([good, bad], "endpoint", 0, command), good, bad)
    if snapshot is None:
        raise BisectError("nothing to probe with: give a SNAPSHOT to replay, or --run CMD")
    if requested not in ORACLES:
        raise BisectError(f"--oracle {requested}: one of {', '.join(ORACLES)}")
    if requested == "recorded":
        command = ProbeCommand.engine(snapshot, options, ("--golden-data",))
        oracle = Oracle("recorded", command, "the outputs recorded in the snapshot, bit for bit")
        return _held(oracle, prober.probe([good, bad], "endpoint", 0, command), good, bad)
    reference = Oracle("reference", ProbeCommand.engine(snapshot, options, REFERENCE_OPTIONS),
                       "the op's reference, single against batched, and the contracts (not the recorded outputs)")
    outputs = prober.scratch / "good-end-outputs"
    keeping = ProbeCommand.engine(snapshot, options, (*REFERENCE_OPTIONS, "--save-outputs", str(outputs)),
                                  oracle_identity=" ".join(("",) + REFERENCE_OPTIONS))
    ends = prober.probe_each({good: keeping, bad: reference.command}, "endpoint", 0, fresh=frozenset({good}))
    both_pass = all(ends[sha].outcome.verdict == GOOD for sha in (good, bad))
    if requested == "good-end":
        _testable(ends[good], "--good")
    elif requested == "reference" or not both_pass:
        chosen = _held(reference, ends, good, bad, hint=" (--oracle good-end compares with the good end's outputs)")
        emit(Step("oracle", f"probes hold each commit to {chosen.note}"))
        return chosen
    chosen = _good_end(prober, snapshot, options, outputs, good, bad, requested)
    emit(Step("oracle", f"probes hold each commit to {chosen.note}"))
    return chosen


def _good_end(prober: Prober, snapshot: Path, options: tuple[str, ...], outputs: Path, good: str, bad: str,
              requested: str) -> Oracle:
    """The good end's outputs as the oracle: bit for bit where a second run there gives the same bits."""
    if not outputs.is_dir():
        raise BisectError(f"--good {good[:10]}: its probe kept no outputs to compare with")
    identity = f" --golden-data <outputs of {good}>"
    exact = ProbeCommand.engine(snapshot, options, ("--golden-data", str(outputs)), oracle_identity=identity)
    again = prober.probe_each({good: exact}, "endpoint", 0, fresh=frozenset({good}))[good]
    why = "both ends pass the reference checks: " if requested == "auto" else ""
    if again.outcome.verdict == GOOD:
        oracle = Oracle("good-end", exact, f"{why}the outputs of the good end {good[:10]} on the recorded inputs, "
                                           "bit for bit (it gives the same bits twice)")
    else:
        _testable(again, "--good")
        _only_golden_comparisons_failed(again)
        spread = _largest_difference(again.outcome.report)
        atol = f"{SPREAD_FACTOR * spread:.3g}"
        command = ProbeCommand.engine(snapshot, options, ("--golden-data", str(outputs), "--atol", atol),
                                      oracle_identity=f"{identity} --atol {atol}")
        oracle = Oracle("good-end", command, f"{why}the outputs of the good end {good[:10]} on the recorded inputs, "
                                             f"within atol {atol}: it is not deterministic run to run (two runs "
                                             f"there differ by up to {spread:.3g})")
    return _held(oracle, {good: again, **prober.probe([bad], "endpoint", 0, oracle.command)}, good, bad,
                 good_checked=False)


def _only_golden_comparisons_failed(record: ProbeRecord) -> None:
    """A second run at the good end that differs from its first only in values is nondeterminism;
    anything else (an error, a contract, a missing output) is a failure of the good end itself."""
    failed = [check for call in (record.outcome.report or {}).get("calls", []) for check in call.get("checks", [])
              if not check.get("passed")]
    other = next((c for c in failed if c.get("kind") not in ("vs-golden", "tag") or "comparison" not in c), None)
    if other is not None or not failed:
        raise BisectError(f"--good {record.sha[:10]} fails when run again on the recorded inputs "
                          f"({other.get('description') if other else record.outcome.reason}); pick another good "
                          "commit, or --oracle reference")


def _largest_difference(report: dict[str, Any] | None) -> float:
    """The largest absolute difference a failing golden comparison in `report` found."""
    found = [check.get("comparison", {}).get("max_abs") for call in (report or {}).get("calls", [])
             for check in call.get("checks", []) if not check.get("passed")]
    numbers = [value for value in found if isinstance(value, (int, float)) and math.isfinite(value)]
    if not numbers:
        raise BisectError("the good end gives other outputs run to run, and not by a finite amount: no tolerance "
                          "holds them; pick --oracle reference")
    return max(numbers)


def _testable(record: ProbeRecord, option: str) -> None:
    if record.outcome.verdict == SKIP:
        raise BisectError(_untestable(option, record))


def _untestable(option: str, record: ProbeRecord) -> str:
    """'--good 4d2c91a6aa cannot be tested (exit 2: ...; the probe said: its last line)'."""
    said = next((line.strip() for line in reversed(record.outcome.output_tail.splitlines()) if line.strip()), "")
    return (f"{option} {record.sha[:10]} cannot be tested ({record.outcome.reason}"
            + (f"; the probe said: {said}" if said else "") + ")")


def _held(oracle: Oracle, ends: dict[str, ProbeRecord], good: str, bad: str, hint: str = "",
          good_checked: bool = True) -> Oracle:
    """`oracle`, once the ends' probes under it say good and bad; else a BisectError naming it."""
    problems = []
    if good_checked and ends[good].outcome.verdict == BAD:
        problems.append(f"--good {good[:10]} is actually bad under the {oracle.name} oracle: the probe fails there "
                        f"({_first_divergence(ends[good])}); pick an older good commit{hint}")
    if ends[bad].outcome.verdict == GOOD:
        problems.append(f"--bad {bad[:10]} is actually good under the {oracle.name} oracle ({oracle.note}): pick a "
                        "newer bad commit, or check the test")
    untestable = [(name, sha) for name, sha in (("--good", good), ("--bad", bad)) if ends[sha].outcome.verdict == SKIP]
    if len(untestable) == 2 and ends[good].outcome.output_tail == ends[bad].outcome.output_tail:
        problems.append(_untestable(f"--good {good[:10]} and --bad", ends[bad]))  # one reason, said once
    else:
        problems += [_untestable(name, ends[sha]) for name, sha in untestable]
    if problems:
        raise BisectError("; ".join(problems))
    return oracle


def _first_divergence(record: ProbeRecord) -> str:
    """What a failing probe's report names first, or its exit status."""
    first = (record.outcome.report or {}).get("first_divergence")
    if isinstance(first, dict) and first.get("op"):
        return f"call {first.get('call')} {first.get('op')}: {first.get('description')}"
    return record.outcome.reason
