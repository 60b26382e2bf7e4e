"""A real third-party kernel library, unchanged: Liger-Kernel (from the package index) in a small
llama-style block (tests/liger_block/block.py: RMSNorm, RoPE, SwiGLU, cross-entropy, forward and
backward, no import of replay), recorded with `replay record` only, replayed bitwise, and a change
planted in a copy of one Liger kernel named by call, kernel and argument.

On a GPU the block runs all four Liger ops. Triton's interpreter (CI, no GPU) cannot run Liger's
RMSNorm and SwiGLU (they call `.to()` on a float argument, which the interpreter passes as a Python
float), so there the block uses torch for those two and Liger's RoPE and cross-entropy only.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import liger_kernel
import pytest
import torch

from user_shell import shell

BLOCK = Path(__file__).resolve().parent / "liger_block" / "block.py"
ROPE, CROSS_ENTROPY = "liger_kernel.ops.rope._triton_rope", "liger_kernel.ops.cross_entropy.liger_cross_entropy_kernel"
RMS_NORM = ("liger_kernel.ops.rms_norm._rms_norm_forward_kernel", "liger_kernel.ops.rms_norm._rms_norm_backward_kernel")
SWIGLU = ("liger_kernel.ops.swiglu._swiglu_forward_kernel", "liger_kernel.ops.swiglu._swiglu_backward_kernel")
# the rotation's backward, its last line for k: the sign of the sine flipped
ROPE_BACKWARD_K = ("        new_k_tile_2 = k_tile_2 * cos_row - k_tile_1 * sin_row\n",
                   "        new_k_tile_2 = k_tile_2 * cos_row + k_tile_1 * sin_row\n")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The block's directory after `replay record -- python block.py` (two training steps)."""
    where = tmp_path_factory.mktemp("liger")
    shutil.copy(BLOCK, where / "block.py")
    done = shell("replay record -- python block.py", where)
    assert done.returncode == 0, done.stderr
    return where


def calls(where: Path) -> list[dict]:
    show = shell("replay show snapshots/block_001 --json -", where)
    assert show.returncode == 0, show.stderr
    return json.loads(show.stdout)["calls"]


def test_every_liger_launch_of_a_step_forward_and_backward_is_recorded(recorded: Path) -> None:
    step = [ROPE, CROSS_ENTROPY, ROPE]  # rotation, loss (its kernel writes the gradient too), rotation's backward
    if torch.cuda.is_available():
        step = [RMS_NORM[0], ROPE, SWIGLU[0], CROSS_ENTROPY, SWIGLU[1], ROPE, RMS_NORM[1]]
    recorded_ops = [c["op"] for c in calls(recorded)]
    assert [op for op in recorded_ops if op.startswith("liger_kernel.")] == step * 2
    entropy = next(c for c in calls(recorded) if c["op"] == CROSS_ENTROPY)
    assert ("out", "X_ptr") in {(t["role"], t["name"]) for t in entropy["tensors"]}  # the gradient, in place


def test_every_launch_replays_bitwise(recorded: Path) -> None:
    done = shell("replay run snapshots/block_001 --provider liger_kernel --json -", recorded)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] and len(report["calls"]) == len(calls(recorded))


def test_a_change_planted_in_a_copy_of_one_liger_kernel_is_named(recorded: Path, tmp_path: Path) -> None:
    copy = tmp_path / "edited"
    shutil.copytree(Path(liger_kernel.__file__).parent, copy / "liger_kernel")
    rope = copy / "liger_kernel" / "ops" / "rope.py"
    text = rope.read_text()
    assert text.count(ROPE_BACKWARD_K[0]) == 1
    rope.write_text(text.replace(*ROPE_BACKWARD_K))
    done = shell(f"replay run snapshots/block_001 --code {copy} --json -", recorded)
    assert done.returncode == 1, done.stdout + done.stderr
    failing = [c for c in json.loads(done.stdout)["calls"] if not c["passed"]]
    backward_ropes = [i for i, c in enumerate(calls(recorded)) if c["op"] == ROPE][1::2]
    assert [c["index"] for c in failing] == backward_ropes and {c["op"] for c in failing} == {ROPE}
    for call in failing:  # k's rotation, not q's
        assert [c["name"] for c in call["checks"] if not c["passed"]] == ["k_ptr"]
    assert "'k_ptr' differs in" in failing[0]["checks"][-1]["description"]
