"""Planted bugs live in kernels/bugs.py alone: no kernel carries a switch that a test flips."""
from __future__ import annotations

import re
from pathlib import Path

import replay_kernels

KERNELS = Path(replay_kernels.__file__).parent
# what a test switch looks like: the bug registry, an environment flag, a constexpr or flag for a fault
SWITCH = re.compile(r"\bbugs\b|planted|planting|KERNELS_PLANTED_BUGS|WRONG_|wrong_scale", re.IGNORECASE)


def test_no_kernel_module_but_bugs_mentions_a_test_switch() -> None:
    offenders = [f"{path.name}:{n}: {line.strip()}"
                 for path in sorted(KERNELS.glob("*.py")) if path.name != "bugs.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if SWITCH.search(line)]
    assert offenders == []


def test_the_pattern_finds_the_switches_it_was_written_against() -> None:
    # the forms the old switches took, so that the scan above cannot pass by matching nothing
    for line in ('indirect = positions is None or bugs.planted("kv_scatter_stale_position_buf")',
                 "WRONG_SCALE: tl.constexpr", "os.environ.get('KERNELS_PLANTED_BUGS')"):
        assert SWITCH.search(line), line
