"""Host copies and events queued through the CUDA runtime itself (replay/recorder/cuda_runtime.py):
the bytes a torch copy would give, errors as RuntimeErrors that leave torch's own checks clean, and
the host tensor over a pooled buffer made only when a writer reads it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replay.recorder import chunk_changes, cuda_runtime, cuda_streams
from replay.recorder.copies import Copier, HostCopy, PinnedPool
from replay.snapshot.tensors import geometry_of, storage_span
from test_capture_piece_changes import contents, record_activations, record_decode

HAS_CUDA = torch.cuda.is_available()


def test_a_host_copy_over_a_pooled_buffer_is_its_span_of_its_dtype_once_read() -> None:
    source = torch.arange(40, dtype=torch.float16).view(8, 5)[1:, ::2]  # a strided view: its span, not its elements
    geometry = geometry_of(source)
    buffer = torch.zeros(4096, dtype=torch.uint8)
    buffer[:geometry.span * 2] = storage_span(source).view(torch.uint8)
    copy = HostCopy(None, geometry, buffer)
    assert copy.nbytes == geometry.span * 2 and copy.made is None  # sized without the tensor being made
    assert copy.span.dtype == torch.float16 and torch.equal(copy.span, storage_span(source))
    assert copy.made is copy.span  # made once


def test_without_a_cuda_runtime_in_the_process_none_is_offered() -> None:
    if HAS_CUDA:
        assert cuda_runtime.loaded() is not None
    else:  # a CPU-only torch: the copier's torch path is the only one
        assert cuda_runtime.loaded() is None and cuda_runtime.on_current_device(torch.device("cuda", 0)) is None


@pytest.fixture
def through_the_runtime(device: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`device`, its tensors' copies and events going through the runtime's path: the CUDA
    runtime's on a GPU, its host twin (the same path, work done at once) on the CPU."""
    if device == "cpu":
        monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))
    return device


def test_copies_through_the_runtime_match_torchs_for_views_and_every_dtype(through_the_runtime: str) -> None:
    device = through_the_runtime
    assert cuda_runtime.on_current_device(torch.empty(0, device=device).device) is not None
    copier = Copier(PinnedPool())
    base = torch.randn(64, 96, device=device)
    tensors = [base, base[3:, 5:70:3], base.t(), base.to(torch.bfloat16)[::2], (base > 0)[:, 7],
               torch.randint(-9, 9, (33,), device=device, dtype=torch.int64), base[:0]]
    expected = [storage_span(t).cpu().clone() for t in tensors]  # torch's copy, made first and waited for
    copies = [copier.copy(t, landed=n % 2 == 0) for n, t in enumerate(tensors)]
    assert all(c.made is None and c.buffer is not None for c in copies)  # queued, nothing made on this thread
    base.fill_(0)  # after the copies on the stream: they hold what was there before
    for event in [c.landed for c in copies if c.landed is not None]:
        event.synchronize()
    copier.mark()()
    for want, copy in zip(expected, copies):
        assert copy.span.dtype == want.dtype and torch.equal(copy.span, want)


@pytest.mark.interpreter
def test_a_recording_through_the_host_twin_holds_what_torchs_path_holds(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ("cpu",))  # tracked stores and blobs staged, as on a GPU
    for path in ("torch", "runtime"):  # a cache written a row a call (chunks); read-only inputs (blobs)
        monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",) if path == "runtime" else ())
        record_decode(tmp_path / path / "decode", "cpu")
        record_activations(tmp_path / path / "activations", "cpu", blob_threshold=1)
    for kind in ("decode", "activations"):
        assert contents(tmp_path / "runtime" / kind) == contents(tmp_path / "torch" / kind)


@pytest.mark.gpu
def test_a_copy_the_runtime_refuses_is_a_runtime_error_and_torch_goes_on() -> None:
    runtime = cuda_runtime.loaded()
    assert runtime is not None
    host = torch.empty(64, dtype=torch.uint8, pin_memory=True)
    stream = runtime.current_stream(torch.cuda.current_device())
    with pytest.raises(RuntimeError, match="CUDA error"):
        runtime.copy_to_host(host.data_ptr(), 0, 64, stream)  # from no device memory at all
    torch.ones(4, device="cuda").sum().item()  # torch's next check sees no error left behind
    event = cuda_streams.event_now(torch.device("cuda", torch.cuda.current_device()))
    assert isinstance(event, cuda_runtime.Event)
    event.synchronize()


@pytest.mark.gpu
def test_issuing_on_a_stream_makes_it_current_and_gives_the_one_before_back() -> None:
    device = torch.cuda.current_device()
    side, before = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    x = torch.zeros(1 << 20, device="cuda")
    with cuda_streams.issuing_on(side):
        assert torch.cuda.current_stream(device) == side
        side.wait_stream(before)
        x.add_(1)  # on `side`: the program's stream knows nothing of it until told
    assert torch.cuda.current_stream(device) == before
    before.wait_stream(side)
    assert float(x.sum()) == x.numel()
    assert cuda_streams.current(device) == before  # by index, as the verifier asks


@pytest.mark.gpu
def test_an_event_says_without_waiting_whether_the_work_before_it_has_run() -> None:
    # a flight recording asks this of each store at every call (flight_pieces.py): never a wait
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda._sleep(200_000_000)  # ~0.1 s of the device's clock
    event = cuda_streams.event_now(device)
    assert isinstance(event, cuda_runtime.Event)
    assert not event.query()
    event.synchronize()
    assert event.query()


def test_the_host_twins_event_is_done_at_once() -> None:
    assert cuda_runtime.HostRuntime.event(0).query()
