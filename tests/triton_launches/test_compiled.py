"""torch.compile's kernels recorded by `replay record` from a program that knows nothing of
kernel-replay: on a GPU through Inductor's launcher (CachingAutotuner.run calls the compiled
binary itself), in the interpreter through the same door (Inductor's CPU backend set to Triton).
The kernels' modules live in Inductor's cache; once it is gone they run again only from the
source the snapshot stores, and only when the user says to trust it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from user_shell import shell

PROGRAM = '''
import os
import torch
if not torch.cuda.is_available():  # no GPU: Inductor writes Triton for the CPU, run by the interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    import torch._inductor.config
    import torch.utils._triton
    torch._inductor.config.cpu_backend = "triton"
    torch.utils._triton.triton_hash_with_backend = lambda: "interpreter"  # it keys its cache by a driver


@torch.compile
def scores(x, w):  # reductions and pointwise around a matmul (softmax's helpers fail in the interpreter)
    return (x @ w).relu().sum(-1) * 2 + (x * x).mean(-1)


device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
x, w = torch.randn(8, 32, device=device), torch.randn(32, 64, device=device)
for _ in range(2):
    out = scores(x, w)
print("done", float(out.sum()))
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program recorded with its Inductor cache in a folder of its own, the cache then removed."""
    where = tmp_path_factory.mktemp("compiled")
    (where / "prog.py").write_text(PROGRAM)
    done = shell(f"TORCHINDUCTOR_CACHE_DIR={where / 'cache'} replay record -o snap -- python prog.py", where)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    shutil.rmtree(where / "cache")
    return where / "snap"


def test_compiled_kernels_are_recorded_with_their_launch_and_generated_source(recorded: Path) -> None:
    done = shell(f"replay show {recorded} --json -", recorded.parent)
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)["calls"]
    assert calls and all(".triton_" in c["op"] for c in calls), [c["op"] for c in calls]
    ops = [c["op"] for c in calls]
    assert ops[: len(ops) // 2] == ops[len(ops) // 2:]  # the two calls of the compiled function, in order
    for call in calls:
        launch = call["triton"]
        assert launch["generated"] and launch["module_source_sha256"], launch
        assert all(g >= 1 for g in launch["grid"]) and launch["options"]["num_warps"] >= 1
        assert launch["config_args"] and set(launch["config_args"]) <= set(launch["autotune"])
        outs = [t for t in call["tensors"] if t["role"] == "out"]
        assert outs, call  # what the kernel wrote, stored after it


def test_compiled_kernels_replay_only_with_trust_after_the_cache_is_gone(recorded: Path) -> None:
    refused = shell(f"replay run {recorded}", recorded.parent)
    assert refused.returncode == 2 and "--trust-recorded-source" in refused.stderr, refused.stderr
    done = shell(f"replay run {recorded} --trust-recorded-source --json -", recorded.parent)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["passed"] and len(result["calls"]) >= 2, result


def test_two_compiles_of_edited_code_pair_launch_for_launch_in_diff(recorded: Path) -> None:
    # the edit changes one generated kernel, so Inductor's module names (cache keys) change too
    where = recorded.parent
    (where / "edited.py").write_text(PROGRAM.replace("(x @ w).relu().sum(-1) * 2", "(x @ w).relu().sum(-1) * 3"))
    done = shell(f"TORCHINDUCTOR_CACHE_DIR={where / 'cache-edited'} replay record -o edited -- python edited.py", where)
    assert done.returncode == 0, done.stderr
    done = shell(f"replay diff {recorded} edited --json -", where)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert not report["structural"], report["structural"]  # every launch found its partner
    first = report["first_divergence"]
    assert first["op"].startswith("generated.triton_") and first["index_a"] == first["index_b"], first
    assert first["tensor"].startswith("out/"), first  # its inputs agree: the edited kernel wrote otherwise
