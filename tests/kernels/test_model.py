"""The tiny model: prefill logits are bit-identical however the prompt is split into calls,
they match the all-reference model, greedy generation agrees, and a recorded prefill is a
real snapshot."""
from __future__ import annotations

import pytest
import torch

import replay_kernels
from replay_kernels.model import TinyLlama, prompt_tokens, record_prefill
from replay.snapshot import Snapshot
from replay.tolerance import Tolerance

PROMPT_LEN = {"cpu": 5, "cuda": 40}  # the interpreter is slow: few tokens on CPU
# The whole model (fp32 activations) against the all-reference model: per-op differences
# of a few fp32 ulps (replay.tolerance) pass through 2 layers and the lm_head.
MODEL_LOGITS = Tolerance(atol=1e-3, rtol=1e-3)


@pytest.fixture
def model(dev):
    return TinyLlama(device=dev)


def test_prefill_logits_are_bit_identical_batched_chunked_and_serial(model, dev):
    prompt = prompt_tokens(PROMPT_LEN[dev])
    batched = model.prefill(prompt)
    model.reset()
    chunked = model.prefill(prompt, chunk_size=2 if dev == "cpu" else 16)
    model.reset()
    serial = model.prefill(prompt, chunk_size=1)
    assert batched.shape == (len(prompt), model.config.vocab)
    assert torch.equal(batched, chunked)
    assert torch.equal(batched, serial)


def test_decode_steps_reproduce_prefill_logits_bit_for_bit(model, dev):
    # single variants, indirect kv_scatter, persistent buffers (a CUDA graph on the GPU)
    prompt = prompt_tokens(PROMPT_LEN[dev])
    prefilled = model.prefill(prompt)
    model.reset()
    model.prefill(prompt[:1])
    decoded = torch.stack([model.decode_step(token).clone() for token in prompt[1:]])
    assert model.kv_cache_lengths.tolist() == [len(prompt)] * model.config.layers
    assert torch.equal(decoded, prefilled[1:])
    if dev == "cuda":
        assert model._graph is not None


def test_logits_and_greedy_tokens_match_the_reference_model(model, dev):
    prompt = prompt_tokens(PROMPT_LEN[dev])
    reference = TinyLlama(device=dev, variants="reference")
    got, expected = model.prefill(prompt), reference.prefill(prompt)
    assert torch.allclose(got, expected, atol=MODEL_LOGITS.atol, rtol=MODEL_LOGITS.rtol), \
        f"max |diff| {(got - expected).abs().max().item():.3g}"
    new = 3 if dev == "cpu" else 8
    assert model.generate(prompt, new) == reference.generate(prompt, new)


def test_recorded_prefill_is_a_snapshot_of_every_op(tmp_path, dev):
    path = record_prefill(tmp_path / "prefill", prompt_len=2, device=dev)
    calls = list(Snapshot(path))
    assert {call.op for call in calls} == set(replay_kernels.OPS)
    assert {call.variant for call in calls} == {"batched"}
    scatter = next(call for call in calls if call.op == "kv_scatter")
    assert set(scatter.role("state")) == {"kv_cache_lengths", "position_buf", "seq_len_buf"}
    assert scatter.role("tag")["positions"].tolist() == [0, 1]
    assert [launch["path"] for launch in scatter.launch] == ["direct"]
