"""Running a model through kv-check's runs and recording them: the same tokens prefilled serially
(one at a time, the decode path), batched, and in chunks, each followed by the same decode steps,
each run recorded under `replay.scope("run", name)` into one snapshot."""
from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from replay.errors import ReplayError
from replay.kv.adapter import KvAdapter
from replay.kv.caches import KvReport, check_snapshot
from replay.recorder import recording
from replay.context import scope
from replay.snapshot import Snapshot

SERIAL = "serial"
WHOLE = 0  # a chunk size meaning the whole prompt at once: the batched run


@dataclass(frozen=True)
class RunPlan:
    prompt_len: int
    chunks: tuple[int, ...]  # chunk sizes; WHOLE for one batched call
    decode_steps: int
    seed: int = 0

    def __post_init__(self) -> None:
        # a chunk as long as the prompt is the batched run: one run a name, none twice
        whole = tuple(dict.fromkeys(WHOLE if c >= self.prompt_len else c for c in self.chunks))
        object.__setattr__(self, "chunks", whole)

    def tokens(self, vocab: int) -> list[int]:
        """The prompt then the decode steps' tokens: pseudo-random below `vocab`, the same every run."""
        rng = random.Random(self.seed)
        return [rng.randrange(vocab) for _ in range(self.prompt_len + self.decode_steps)]

    def names(self) -> list[str]:
        return [SERIAL, *(run_name(c, self.prompt_len) for c in self.chunks)]


def run_name(chunk: int, prompt_len: int) -> str:
    return "batched" if chunk in (WHOLE, prompt_len) else f"chunks of {chunk}"


def parse_chunks(text: str) -> tuple[int, ...]:
    """'1,4,N' -> (1, 4, WHOLE): N is the whole prompt in one batched call."""
    found = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part.upper() == "N":
            found.append(WHOLE)
        elif part.isdigit() and int(part) > 0:
            found.append(int(part))
        else:
            raise ReplayError(f"--chunks {text!r}: each chunk is a positive number of tokens or N (the whole prompt)")
    if not found:
        raise ReplayError(f"--chunks {text!r}: no chunk size given")
    return tuple(dict.fromkeys(found))


def check_model(factory: Callable[[str], KvAdapter], device: str, plan: RunPlan, keep_dir: Path | None = None,
                on_run: Callable[[str], None] = lambda name: None) -> KvReport:
    """Record the runs of `plan` (into `keep_dir`, else a temporary directory removed after) and check them."""
    with tempfile.TemporaryDirectory(prefix="replay-kv-check-") as scratch:
        out_dir = keep_dir or Path(scratch) / "runs"
        logits = record_runs(factory, device, plan, out_dir, on_run)
        return check_snapshot(Snapshot(out_dir), logits=logits)


def record_runs(factory: Callable[[str], KvAdapter], device: str, plan: RunPlan, out_dir: Path,
                on_run: Callable[[str], None] = lambda name: None) -> dict[str, torch.Tensor]:
    """Record every run of `plan` into a new snapshot at `out_dir`; returns each run's logits of the
    last token it processed."""
    adapter = _model_step("building the model", lambda: factory(device))
    tokens = plan.tokens(getattr(adapter, "vocab", 32))
    last: dict[str, torch.Tensor] = {}
    # strict: a capture failure must stop the check, not leave a run half recorded and compared
    with recording(out_dir, notes=f"replay kv-check: {', '.join(plan.names())}", strict=True):
        for name, chunk in runs_of(plan):
            on_run(name)
            with scope("run", name):
                logits = _model_step(f"the {name} run", lambda: run_once(adapter, tokens, plan.prompt_len, chunk))
            last[name] = logits.detach().float().cpu().reshape(-1)
    return last


def run_once(adapter: KvAdapter, tokens: list[int], prompt_len: int, chunk: int | None) -> torch.Tensor:
    """One run from an empty cache: every token decoded (chunk None), or the first `prompt_len`
    prefilled in chunks of `chunk` (WHOLE: at once) and the rest decoded; the last token's logits."""
    adapter.reset()
    if chunk is None:
        return _serial(adapter, tokens)
    return _prefill_then_decode(adapter, tokens[:prompt_len], tokens[prompt_len:], chunk)


def _model_step(doing: str, step: Callable[[], Any]) -> Any:
    """`step()`; the model failing is said in one line (a prompt longer than its cache, a broken adapter)."""
    try:
        return step()
    except ReplayError:
        raise
    except Exception as exc:
        raise ReplayError(f"kv-check: {doing} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") \
            from None


def runs_of(plan: RunPlan) -> Iterator[tuple[str, int | None]]:
    """(run name, chunk size) in order: the serial run first (chunk None), then each chunk size."""
    yield SERIAL, None
    for chunk in plan.chunks:
        yield run_name(chunk, plan.prompt_len), chunk


def _serial(adapter: KvAdapter, tokens: Iterable[int]) -> torch.Tensor:
    logits = None
    for token in tokens:
        logits = adapter.decode(token)
    assert logits is not None  # a run has at least one token (prompt_len >= 1)
    return logits


def _prefill_then_decode(adapter: KvAdapter, prompt: list[int], rest: list[int], chunk: int) -> torch.Tensor:
    logits = adapter.prefill(prompt, None if chunk == WHOLE else chunk)[-1]
    for token in rest:
        logits = adapter.decode(token)
    return logits
