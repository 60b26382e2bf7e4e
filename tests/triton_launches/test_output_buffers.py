"""An output buffer (a parameter a kernel writes and never reads) is recorded as the elements the
launch left unchanged (format 5, replay/snapshot/unwritten.py): what torch.empty left in it never
reaches the snapshot, a replay gets it back where the kernel did not write, and a kernel that now
leaves an element unwritten shows there."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

import replay
from replay.cli import main
from replay.recorder import unchanged_bits
from replay.snapshot import unwritten
from replay.snapshot.reader import Snapshot

KERNELS = '''import triton
import triton.language as tl


@triton.jit
def head(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)
'''
LEFTOVER = 1234.5678  # what the buffer held before: bytes no kernel here writes
DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.float64, torch.bool]


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of the user's own (`buffer_kernels`), importable while the test records."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "buffer_kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path / "clean"))
    import buffer_kernels
    yield buffer_kernels
    sys.modules.pop("buffer_kernels", None)


def replayed(snapshot: Path, code: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", str(snapshot), "--code", str(code), "--json", "-"])
    return result.exit_code, json.loads(result.stdout)


def test_a_buffer_the_launch_fills_is_stored_without_what_it_held(tmp_path: Path, kernels, device: str) -> None:
    x = torch.arange(12.0, device=device)
    out = torch.full((12,), LEFTOVER, device=device)
    with replay.recording(tmp_path / "snap"):
        kernels.head[(1,)](x, out, 12, BLOCK=16)
    (call,) = Snapshot(tmp_path / "snap")
    assert call.triton["write_only"] == ["out_ptr"] and set(call.tensors) == {"in/x_ptr", "in/out_ptr", "out/out_ptr"}
    assert call.tensors["in/out_ptr"].isnan().all()  # every element written: none of the old bytes kept
    leftover = struct.pack("<f", LEFTOVER)
    assert not any(leftover in f.read_bytes() for f in (tmp_path / "snap").rglob("*") if f.is_file())
    assert replayed(tmp_path / "snap", tmp_path / "clean")[0] == 0


def test_what_the_launch_left_unwritten_replays_and_an_element_it_no_longer_writes_shows(
        tmp_path: Path, kernels, device: str) -> None:
    x = torch.arange(12.0, device=device)
    out = torch.full((16,), LEFTOVER, device=device)
    with replay.recording(tmp_path / "snap"):
        kernels.head[(1,)](x, out, 12, BLOCK=16)  # elements 12-15 left as they were
    (call,) = Snapshot(tmp_path / "snap")
    before = call.tensors["in/out_ptr"]
    assert before[:12].isnan().all() and (before[12:] == LEFTOVER).all()
    assert replayed(tmp_path / "snap", tmp_path / "clean")[0] == 0
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "buffer_kernels.py").write_text(KERNELS.replace("mask = offs < n", "mask = offs < n - 1"))
    exit_code, report = replayed(tmp_path / "snap", tmp_path / "edited")
    assert exit_code == 1
    assert "'out_ptr' differs in 1/16 elements; first at [11]: nan vs 22.0" in json.dumps(report)


def test_the_mask_made_by_the_kernel_records_the_same(tmp_path: Path, kernels, device: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unchanged_bits, "DEVICES", (device,))  # on the CPU, the kernel in the interpreter

    def torch_made(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the mask was made by torch's operations, not the kernel")
    monkeypatch.setattr(unwritten, "unchanged_mask", torch_made)
    x = torch.arange(12.0, device=device)
    out = torch.full((16,), LEFTOVER, device=device)
    with replay.recording(tmp_path / "snap"):
        kernels.head[(1,)](x, out, 12, BLOCK=16)
    (call,) = Snapshot(tmp_path / "snap")
    before = call.tensors["in/out_ptr"]
    assert before[:12].isnan().all() and (before[12:] == LEFTOVER).all()
    assert replayed(tmp_path / "snap", tmp_path / "clean")[0] == 0


def test_a_count_near_two_to_the_31_still_writes_every_mask_byte(device: str) -> None:
    # the last mask byte's bound, worked out from a 32-bit count, must not wrap
    gen = torch.Generator().manual_seed(3)
    before = torch.randint(0, 256, (8192,), dtype=torch.uint8, generator=gen)
    after = before.clone()
    after[::3] ^= 1
    before, after = before.to(device), after.to(device)
    mask = torch.zeros(1024, dtype=torch.uint8, device=device)
    elements = 2 ** 31 - 1  # one program reads the first 8192 of them: all of these
    unchanged_bits._LAUNCHERS[1].in_triton((1, 1, 1), before.data_ptr(), after.data_ptr(), mask.data_ptr(), elements)
    assert torch.equal(mask.cpu(), unwritten.unchanged_mask(before, after).cpu())


def test_counts_of_two_to_the_31_or_more_have_a_variant_of_their_own() -> None:
    # Triton passes an integer of 2^31 or more as 64 bits: a launcher compiled for 32 cannot take it
    from replay.direct_launch import _widths
    assert _widths((1 << 40, 2 ** 31 - 1)) == _widths((1 << 40, 5))
    assert _widths((1 << 40, 2 ** 31)) != _widths((1 << 40, 2 ** 31 - 1))
    assert _widths((-(2 ** 31) - 1,)) != _widths((-(2 ** 31),))
    assert unchanged_bits._LAUNCHERS[2] is not unchanged_bits._LAUNCHERS[1]


@pytest.mark.gpu
def test_a_buffer_of_two_to_the_31_elements_after_a_small_one_gets_its_mask() -> None:
    small = torch.zeros(64, dtype=torch.int8, device="cuda")
    unchanged_bits.unchanged_mask(small, small + 1, small.numel())  # compiles the 32-bit count's variant first
    before = torch.zeros(2 ** 31 + 64, dtype=torch.int8, device="cuda")
    after = before.clone()
    after[-70:-3] = 1
    made = unchanged_bits.unchanged_mask(before, after, after.numel())
    assert torch.equal(made, unwritten.unchanged_mask(before, after))


def test_a_mask_kernel_that_fails_leaves_the_masks_to_torch(tmp_path: Path, kernels, device: str,
                                                             monkeypatch: pytest.MonkeyPatch, said) -> None:
    class Failing:
        def launch(self, *args: object) -> None:
            raise OverflowError("signed integer is greater than maximum")
    monkeypatch.setattr(unchanged_bits, "DEVICES", (device,))
    monkeypatch.setattr(unchanged_bits, "_FAILED", set())
    monkeypatch.setattr(unchanged_bits, "_LAUNCHERS", {size: Failing() for size in (1, 2, 4, 8)})
    x = torch.arange(12.0, device=device)
    with replay.recording(tmp_path / "snap"):
        for _ in range(2):  # the second, after the kernel failed: no launch tried
            kernels.head[(1,)](x, torch.full((16,), LEFTOVER, device=device), 12, BLOCK=16)
    before = [call.tensors["in/out_ptr"] for call in Snapshot(tmp_path / "snap")]
    assert before[0][:12].isnan().all() and (before[0][12:] == LEFTOVER).all()
    assert before[1][:12].isnan().all() and (before[1][12:] == LEFTOVER).all()
    assert [line for line in said() if "mask kernel" in line] == [
        f"replay: capture: the recorder's mask kernel failed on {x.device} (OverflowError: signed integer "
        "is greater than maximum); output buffers' masks are made by torch's operators there from now on"]


def test_an_out_buffer_of_an_operator_is_stored_the_same_way(tmp_path: Path) -> None:
    x, buffer = torch.arange(4.0), torch.full((6,), LEFTOVER)
    with replay.recording(tmp_path / "snap", torch_ops=True, triton=False):
        torch.add(x, 1, out=buffer[:4])
    (call,) = Snapshot(tmp_path / "snap")
    before = call.tensors["in/out"]
    assert call.torch_op["write_only"] == ["out"] and before.isnan().all() and "kept/out" not in call.tensors
    result = CliRunner().invoke(main, ["run", str(tmp_path / "snap")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("size", [0, 1, 7])
@pytest.mark.parametrize("through_the_runtime", [False, True])  # its host twin on the CPU: the bytes held raw
@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_an_out_buffer_the_operator_resizes_is_stored_as_the_bytes_it_held(tmp_path: Path, size: int,
                                                                           through_the_runtime: bool,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from replay.recorder import cuda_runtime
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",) if through_the_runtime else ())
    with replay.recording(tmp_path / "snap", torch_ops=True, triton=False):
        torch.add(torch.arange(4.0), 1, out=torch.full((size,), LEFTOVER))
    (call,) = Snapshot(tmp_path / "snap")
    assert torch.equal(call.tensors["in/out"], torch.full((size,), LEFTOVER))
    assert call.tensors["out/out"].tolist() == [1.0, 2.0, 3.0, 4.0] and not Snapshot(tmp_path / "snap").problems
    result = CliRunner().invoke(main, ["run", str(tmp_path / "snap")])
    assert result.exit_code == 0, result.output


def test_golden_data_compares_inputs_but_not_what_an_output_buffer_held(tmp_path: Path) -> None:
    from replay.engine.session import _same_inputs
    from replay.snapshot.reader import CallRecord

    def record(x: float, leftover: float, swapped: bool = False) -> CallRecord:
        tensors = {"in/x_ptr": torch.full((4,), x), "in/out_ptr": torch.full((4,), leftover)}
        args = [{"name": "x_ptr", "tensor": "in/x_ptr"}, {"name": "out_ptr", "tensor": "in/out_ptr"}]
        return CallRecord(0, "k", "triton", "m", args, dict(reversed(tensors.items())) if swapped else tensors,
                          triton={"write_only": ["out_ptr"]})
    assert _same_inputs(record(1.0, LEFTOVER), record(1.0, 0.0, swapped=True))  # leftovers and key order aside
    assert not _same_inputs(record(1.0, LEFTOVER), record(2.0, LEFTOVER))


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(DTYPES), size=st.integers(0, 70), seed=st.integers(0, 2 ** 16))
def test_the_mask_marks_exactly_the_unchanged_elements_and_every_changed_one_differs_after(dtype, size, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    width = torch.empty(0, dtype=dtype).element_size()
    values = torch.tensor([0, 1] if dtype == torch.bool else [0, 1, 0xFE, 0xFF], dtype=torch.uint8)
    raw_before = values[torch.randint(0, len(values), (size, width), generator=gen)]  # FILL bytes among them
    before = raw_before.view(-1).view(dtype)
    after = before.clone()
    changed = torch.rand(size, generator=gen) < 0.5
    after.view(torch.uint8).view(size, width)[changed] ^= 1  # every byte of a changed element flips its low bit
    mask = unwritten.unchanged_mask(before, after)
    assert mask.dtype == torch.uint8 and mask.numel() == unwritten.mask_bytes(size)
    bits = [(mask[i // 8].item() >> (i % 8)) & 1 for i in range(size)]
    assert bits == (~changed).int().tolist()
    made = unwritten.before_from(after, mask)
    raw_made = made.view(torch.uint8).view(size, width)
    assert torch.equal(raw_made[~changed], raw_before[~changed])
    if dtype == torch.bool:
        assert torch.equal(made[changed], ~after[changed])
    else:  # FILL bytes, but zero bytes where the element after the call is FILL bytes itself
        after_was_fill = (after.view(torch.uint8).view(size, width) == unwritten.FILL).all(dim=1)
        assert (raw_made[changed & ~after_was_fill] == unwritten.FILL).all()
        assert (raw_made[changed & after_was_fill] == 0).all()
    assert not (made[changed] == after[changed]).any()  # each differs as the dtype compares it


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # `device`: the same for every example
@given(dtype=st.sampled_from(DTYPES), size=st.sampled_from([0, 1, 7, 8, 9, 63, 8191, 8192, 8200, 20000]),
       seed=st.integers(0, 2 ** 16))
def test_the_kernel_makes_the_mask_torch_makes(dtype: torch.dtype, size: int, seed: int, device: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    width = torch.empty(0, dtype=dtype).element_size()
    before = torch.randint(0, 256, (size * width,), dtype=torch.uint8, generator=gen)
    after = before.clone().view(size, width)
    changed = torch.rand(size, generator=gen) < 0.5
    byte = torch.randint(0, width, (size,), generator=gen)  # one byte of a changed element differs, no more
    after[changed, byte[changed]] ^= 1 << torch.randint(0, 8, (int(changed.sum()),), generator=gen).to(torch.uint8)
    before, after = before.view(dtype).to(device), after.view(-1).view(dtype).to(device)
    original = unchanged_bits.DEVICES
    unchanged_bits.DEVICES = (torch.device(device).type,)  # not a fixture: hypothesis runs many examples a test
    try:
        made = unchanged_bits.unchanged_mask(before, after, after.numel())
    finally:
        unchanged_bits.DEVICES = original
    assert made.device == after.device and torch.equal(made.cpu(), unwritten.unchanged_mask(before, after).cpu())
    bits = (made.cpu().view(-1, 1) >> torch.arange(8, dtype=torch.uint8)) & 1
    assert torch.equal(bits.view(-1)[:size] == 1, ~changed)


@pytest.mark.parametrize("by_kernel", [True, False])
def test_a_span_held_as_bytes_against_one_past_a_storage_offset(by_kernel: bool, device: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # the recorder passes what it held before a call as bytes, and the buffer itself, whose span
    # starts at its first element: no view made of either on the program's thread
    monkeypatch.setattr(unchanged_bits, "DEVICES", (device,) if by_kernel else ())
    storage = torch.arange(40, dtype=torch.float32, device=device)
    after = storage[8:].view(4, 8)[:, :6]  # the span: elements 8 .. 37
    before = storage[8:38].clone().view(torch.uint8)
    after[1, 2] = -1.0
    after[3, 5] = -2.0
    made = unchanged_bits.unchanged_mask(before, after, 30)
    expected = unwritten.unchanged_mask(storage[8:38].clone().fill_(0).copy_(before.view(torch.float32)),
                                        storage[8:38])
    assert torch.equal(made.cpu(), expected.cpu())
    bits = (made.cpu().view(-1, 1) >> torch.arange(8, dtype=torch.uint8)) & 1
    assert bits.view(-1)[:30].logical_not().nonzero().flatten().tolist() == [10, 29]


def test_later_steps_take_the_recorders_device_memory_from_buffers_kept_for_reuse(
        tmp_path: Path, kernels, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # an allocation through torch lets go of the interpreter lock beside the writers: after a
    # step, the held copy of each output buffer and its mask are the kept ones again
    from replay.recorder import chunk_changes, cuda_runtime
    monkeypatch.setattr(unchanged_bits, "DEVICES", (device,))
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # on the CPU, the runtime's host twin
    allocated: list[int] = []
    real = chunk_changes.staging_buffer

    def counting(nbytes: int, on: torch.device) -> torch.Tensor:
        allocated.append(nbytes)
        return real(nbytes, on)
    monkeypatch.setattr(chunk_changes, "staging_buffer", counting)
    x = torch.arange(12.0, device=device)
    outs = [torch.full((n,), LEFTOVER, device=device) for n in (16, 40)]
    by_step = []
    with replay.recording(tmp_path / "snap") as rec:
        for _ in range(4):
            for out in outs:
                kernels.head[(1,)](x, out, 12, BLOCK=16)
            rec.flush()  # the writers done with the step's copies: their buffers given back
            by_step.append(len(allocated))
    assert by_step[0] == 4 and by_step[-1] == by_step[0]  # two buffers a call, the first step only
    calls = list(Snapshot(tmp_path / "snap"))
    assert len(calls) == 8 and all((c.tensors["in/out_ptr"][12:] == LEFTOVER).all() for c in calls)
