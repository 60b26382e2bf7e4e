"""KV-cache validation: several runs over the same tokens must leave the same KV cache.

A recording holds runs told apart by `replay.scope("run", name)`: a serial prefill (one token
at a time, the decode path), a batched one, chunked ones. For each run and layer, the last call
that mutates `k_cache` and `v_cache` leaves that layer's cache; the written positions (below the
baseline run's `kv_cache_lengths`) are compared bitwise with the first run's, the lengths
exactly. Every such call is also checked against the state it read: `seq_len_buf` holds its rows,
and the positions it writes (`positions` when given, else `position_buf`) continue
`kv_cache_lengths`. A difference names run, layer, K or V, head and positions, and the call that
should have written the first of them, with the path it took and what it read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from replay.compare import bit_pattern, row_ranges
from replay.errors import ReplayError
from replay.summary import key_params
from replay.snapshot import Snapshot

BASELINE_RUN = "recorded"  # the run name of calls recorded outside any "run" scope


@dataclass(frozen=True)
class CacheNames:
    """The cache writer's argument names (defaults: kernels/kv_scatter.py's)."""

    k_cache: str = "k_cache"
    v_cache: str = "v_cache"
    lengths: str = "kv_cache_lengths"
    rows: str = "k"
    positions: str = "positions"
    position_buf: str = "position_buf"
    seq_len_buf: str = "seq_len_buf"
    block_table: str = "block_table"


@dataclass
class Writer:
    """One call that wrote a layer's cache: enough to say what it did."""

    call: int
    op: str
    variant: str
    step: Any
    before: int  # kv_cache_lengths before the call
    rows: int
    paths: list[str]
    params: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call, "op": self.op, "variant": self.variant, "step": self.step, "before": self.before,
                "rows": self.rows, "paths": self.paths, "params": self.params}

    def describe(self) -> str:
        path = f", path {'/'.join(self.paths)}" if self.paths else ""
        read = "; ".join(f"{k}={v['first'] if isinstance(v, dict) else v}" for k, v in self.params.items()
                         if k in ("positions", "position_buf", "seq_len_buf", "kv_cache_lengths") and v is not None)
        return f"call {self.call} ({self.op} {self.variant}, step {self.step}{path}; read {read})"


@dataclass
class LayerState:
    k: torch.Tensor | None = None  # [P, heads, dim] by logical position
    v: torch.Tensor | None = None
    length: int = 0
    writers: list[Writer] = field(default_factory=list)


@dataclass
class Finding:
    """A difference from the baseline run, or a state buffer holding the wrong value."""

    kind: str  # "kv", "lengths", "state", "logits"
    run: str
    message: str
    layer: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "run": self.run, "layer": self.layer, "message": self.message, **self.details}


@dataclass
class KvReport:
    runs: list[str]
    layers: int
    positions: int  # written positions compared (the baseline's kv_cache_lengths)
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "runs": self.runs, "baseline": self.runs[0] if self.runs else None,
                "layers": self.layers, "positions": self.positions, "findings": [f.to_json() for f in self.findings]}


def check_snapshot(snapshot: Snapshot, names: CacheNames = CacheNames(),
                   logits: dict[str, torch.Tensor] | None = None) -> KvReport:
    """Each run of `snapshot` against the first, every cache write against its state, and each
    run's `logits` of its last token (when the runs were driven here) against the first run's.
    A recording with no cache write is bad input: there would be nothing to check."""
    runs: dict[str, dict[int, LayerState]] = {}
    findings: list[Finding] = []
    for entry in snapshot.entries:
        record = snapshot.load(entry)
        outputs, args = record.role("out"), record.arguments()
        if names.k_cache not in outputs or names.v_cache not in outputs:
            continue
        scope = given if isinstance(given := record.meta.get("scope"), dict) else {}
        run = str(scope.get("run", BASELINE_RUN))
        layer = scope.get("layer", 0)
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ReplayError(f"{snapshot.path}: call {entry.index}: scope layer {layer!r} is not an integer")
        state = runs.setdefault(run, {}).setdefault(layer, LayerState())
        try:
            findings += _take_write(state, run, layer, _writer(entry.index, record, args, scope, names), args,
                                    outputs, names)
        except (IndexError, ValueError, RuntimeError, TypeError) as exc:  # tensors of shapes no writer leaves
            raise ReplayError(f"{snapshot.path}: call {entry.index} ({entry.op}): its cache, lengths or block "
                              f"table cannot be read as a KV cache write: {type(exc).__name__}: {exc}") from None
    names_of_runs = list(runs)
    if not names_of_runs:
        raise ReplayError(f"{snapshot.path}: no call writes a KV cache (a call whose outputs include "
                          f"'{names.k_cache}' and '{names.v_cache}'), so there is nothing to check")
    findings += logits_findings(logits or {})
    baseline = runs[names_of_runs[0]]
    positions = max((s.length for s in baseline.values()), default=0)
    for run in names_of_runs[1:]:
        findings += _compare(run, runs[run], names_of_runs[0], baseline)
    return KvReport(names_of_runs, len(baseline), positions, findings)


def _take_write(state: LayerState, run: str, layer: int, writer: Writer, args: dict[str, Any],
                outputs: dict[str, torch.Tensor], names: CacheNames) -> list[Finding]:
    """Record one cache write into its layer's state; the findings on the state it read."""
    state.writers.append(writer)
    findings = _state_findings(run, layer, writer, args, names)
    table = args.get(names.block_table)
    after = outputs.get(names.lengths)
    state.length = int(after.reshape(-1)[0]) if isinstance(after, torch.Tensor) else writer.before + writer.rows
    capacity = _capacity(outputs[names.k_cache], table)
    if not 0 <= state.length <= capacity:
        findings.append(Finding("lengths", run, f"layer {layer}: kv_cache_lengths is {state.length} after "
                                                f"{writer.describe()}, outside the cache's {capacity} positions",
                                layer))
        state.length = min(max(state.length, 0), capacity)
    state.k = _by_position(outputs[names.k_cache], table, state.length)
    state.v = _by_position(outputs[names.v_cache], table, state.length)
    return findings


def _writer(index: int, record: Any, args: dict[str, Any], scope: dict[str, Any], names: CacheNames) -> Writer:
    lengths, rows = args.get(names.lengths), args.get(names.rows)
    paths = [str(launch["path"]) for launch in record.launch if "path" in launch]
    return Writer(index, record.op, record.variant, scope.get("step"),
                  int(lengths.reshape(-1)[0]) if isinstance(lengths, torch.Tensor) else 0,
                  rows.shape[0] if isinstance(rows, torch.Tensor) else 0, paths, key_params(args))


def _state_findings(run: str, layer: int, writer: Writer, args: dict[str, Any], names: CacheNames) -> list[Finding]:
    """The state a cache write read, against the rows it writes and the length before it."""
    found = []
    expected = list(range(writer.before, writer.before + writer.rows))
    seq_len = args.get(names.seq_len_buf)
    if isinstance(seq_len, torch.Tensor) and int(seq_len.reshape(-1)[0]) != writer.rows:
        found.append(Finding("state", run, f"step {writer.step}, layer {layer}: seq_len_buf holds "
                                           f"{int(seq_len.reshape(-1)[0])} before {writer.describe()} reads it, "
                                           f"but the call writes {writer.rows} row(s)", layer,
                             {"call": writer.call, "buffer": names.seq_len_buf}))
    given = args.get(names.positions)
    source, held = (names.positions, given) if isinstance(given, torch.Tensor) else \
        (names.position_buf, args.get(names.position_buf))
    if isinstance(held, torch.Tensor):
        values = held.reshape(-1)[:writer.rows].tolist()
        if values != expected:
            found.append(Finding("state", run, f"step {writer.step}, layer {layer}: {source} holds {values} "
                                               f"before {writer.describe()} reads it; kv_cache_lengths "
                                               f"{writer.before} + arange({writer.rows}) expects {expected}", layer,
                                 {"call": writer.call, "buffer": source, "held": values, "expected": expected}))
    return found


def _capacity(cache: torch.Tensor, table: Any) -> int:
    """Logical positions the cache can hold: the block table's pages when paged."""
    if isinstance(table, torch.Tensor) and cache.dim() == 4:
        return min(table.numel(), cache.shape[0]) * cache.shape[1]
    return cache.shape[0]


def _by_position(cache: torch.Tensor, table: Any, length: int) -> torch.Tensor:
    """The cache's first `length` logical positions, [P, heads, dim]: through the block table when
    the cache is paged ([pages, page, heads, dim])."""
    positions = torch.arange(length)
    if isinstance(table, torch.Tensor) and cache.dim() == 4:
        page = cache.shape[1]
        pages = table.reshape(-1).long().cpu()[positions // page]
        return cache[pages, positions % page]
    return cache[:length]


def _compare(run: str, layers: dict[int, LayerState], baseline_run: str,
             baseline: dict[int, LayerState]) -> list[Finding]:
    found = []
    for layer, expected in sorted(baseline.items()):
        got = layers.get(layer)
        if got is None:
            found.append(Finding("kv", run, f"layer {layer}: never written (the {baseline_run} run wrote it)", layer))
            continue
        if got.length != expected.length:
            found.append(Finding("lengths", run, f"layer {layer}: kv_cache_lengths is {got.length}, the "
                                                 f"{baseline_run} run's {expected.length}", layer))
        count = min(got.length, expected.length)
        for name in ("K", "V") if count else ():
            mine, theirs = (got.k, expected.k) if name == "K" else (got.v, expected.v)
            assert mine is not None and theirs is not None  # a layer with a length has both caches
            mine, theirs = mine[:count], theirs[:count]
            if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
                found.append(Finding("kv", run, f"layer {layer} {name}: a {list(mine.shape)} {mine.dtype} cache, the "
                                                f"{baseline_run} run's {list(theirs.shape)} {theirs.dtype}", layer))
                continue
            differs = (bit_pattern(mine) != bit_pattern(theirs)).reshape(count, mine.shape[1], -1).any(-1)
            if not differs.any():
                continue
            positions = sorted({int(p) for p in differs.any(1).nonzero().reshape(-1)})
            first = positions[0]
            head = int(differs[first].nonzero()[0])
            writer = next((w for w in got.writers if w.before <= first < w.before + w.rows), None)
            by = f"; position {first} is {writer.describe()}'s to write" if writer else ""
            found.append(Finding("kv", run, f"layer {layer} {name}: positions {row_ranges(positions)} of "
                                            f"{count} differ from the {baseline_run} run (first: head {head}, "
                                            f"position {first}){by}", layer,
                                 {"tensor": name, "positions": positions, "head": head,
                                  "writer": writer.to_json() if writer else None}))
    return found


def logits_findings(last: dict[str, torch.Tensor]) -> list[Finding]:
    """Each run's logits of its last token against the first run's, bit for bit."""
    runs = list(last)
    found = []
    for run in runs[1:]:
        mine, theirs = last[run], last[runs[0]]
        if mine.shape != theirs.shape or not torch.equal(bit_pattern(mine), bit_pattern(theirs)):
            worst = float((mine - theirs).abs().max()) if mine.shape == theirs.shape else float("nan")
            found.append(Finding("logits", run, f"logits of the last token differ from the {runs[0]} run "
                                                f"(max abs difference {worst:.3g})", None, {"max_abs": worst}))
    return found
