"""What replay.verify costs the program it watches: the tiny model's decode loop and a 7B-shaped
MLP forward, with verification off and at sample 0.01, 0.1 and 1.0, in one process.

    PYTHONPATH=. python3 scripts/bench_verify.py [--device cuda|cpu] [--runs 5]
    PYTHONPATH=. python3 scripts/bench_verify.py --workloads tiny --modes "gate off,within its budget" --no-rare-bug

Each run of a mode is paired with a run of the workload unverified just before or after it
(the order alternating), and a mode's ratio is the median over --runs pairs of its run's wall
time over its partner's (synchronised at the end; verification's pending checks drained after
each run: their cost to the program is what the program waits for, not the checks themselves).
The lent GPU hosts change speed by up to a third from one second to the next (the same
unverified run measured 58-104 ms on one H200 lease, 2026-11-27): runs 0.1 s apart see the same
host, where medians of runs taken seconds apart did not. The modes take turns in an order
shuffled each round, so that the mode run just before reaches them all alike. The table gives
each mode's median time and its median paired ratio; the "off" row's ratio, of two unverified
runs, is the pairing's own noise. Each mode's verification is made at its first run and kept
through the rest (switching modes swaps hooks): its gate learns and its references' graphs are
captured once, as in a program verified all along, not at every run. Before timing, every mode
runs --warmup rounds untimed (kernels compiled, the gate warmed up, the verifier's stream and
its first references made).
The decode loop runs eagerly (no CUDA graph) in every row, so that the rows differ in
verification only; it is timed on a GPU only (on a CPU its kernels run in the Triton
interpreter). Floors are timed with them: every call routed through a hook that only calls the
op (what any check that runs Python at every call must pay; the verifier's unchecked call pays
less: the op's wrapper compares its number with the policy's and calls the op, no hook: the row
"sample 0, outlier gate off: the unchecked call"); the same hook waiting for the GPU before
each call (what a gate reading the call's tensors on the host would pay); the hook running the
op's reference after every call, from which the least that checking 1% of calls can cost
follows (1% of what the reference adds: the reference shares the GPU). Prints a Markdown table,
one row per mode, the calls the gate flagged on the clean runs, the share of calls a gate
within its time budget (outliers=True) read by the end, and how soon a planted rare bug (wrong
only where a row holds a spike) is caught at sample 0.01, by a gate reading every call, one
within its budget and one reading 1 call in 8.
"""
from __future__ import annotations

import argparse
import gc
import inspect
import random
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch

import replay
from replay import recorder
from replay.recorder.staging import CallSpec
from replay.registry import get_op
from replay.tolerance import REDUCTION
from replay.verify import reference_graphs
from replay.verify.verifier import VERIFIER, WINDOW, Policy

# (label, how verification is set for an op): None off; a float the sampling rate (gate on, within
# its time budget: outliers=True); (rate, gate on or off, or the share of calls it reads[, "eager":
# each check's reference run operator by operator, as the verifier did until 2026-11-27, not
# replayed as its kind's CUDA graph]); a str a floor hook
MODES: tuple[tuple[str, object], ...] = (
    ("off", None), ("floor: every call through a hook", "hook"),
    ("floor: the hook waits for the GPU", "sync"), ("the hook runs the reference after every call", "reference"),
    ("floor: the hook reads each tensor argument's address, size and type", "inspect"),
    ("sample 0, outlier gate off: the unchecked call", (0.0, False)),
    ("sample 0, outlier gate on: the gate's statistics, within its budget", (0.0, True)),
    ("sample 0, outlier gate reading every call", (0.0, 1.0)),
    ("sample 0, outlier gate reading 1 call in 8", (0.0, 0.125)),
    ("sample 0.01, outlier gate off", (0.01, False)),
    ("sample 0.01, outlier gate off, references eager", (0.01, False, "eager")),
    ("sample 0.01 (the gate within its budget)", 0.01), ("sample 0.01, references eager", (0.01, True, "eager")),
    ("sample 0.01, outlier gate reading every call", (0.01, 1.0)),
    ("sample 0.01, outlier gate reading 1 call in 8", (0.01, 0.125)),
    ("sample 0.1", 0.1), ("sample 1.0", 1.0), ("sample 1.0, references eager", (1.0, True, "eager")))
GRAPH_DEVICES = reference_graphs.GRAPH_DEVICES


replay.op("bench_verify_linear", tolerance=REDUCTION)
spiky = replay.op("bench_verify_spiky", batch_axes={"x": 0, "out": 0})


@spiky.reference
def spiky_reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@spiky.batched
def spiky_batched(x: torch.Tensor) -> torch.Tensor:
    """Wrong only for rows holding a value over 50 (a rare input pattern)."""
    return x * 2 + (x.abs().amax(dim=1, keepdim=True) > 50).to(x.dtype)


@replay.capture("bench_verify_linear")
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()


@replay.capture("bench_verify_linear", "reference")
def linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().t()).to(x.dtype)


small = replay.op("bench_verify_small")
small.reference(spiky_reference)


@small.batched
def doubled(x: torch.Tensor) -> torch.Tensor:
    """One small op: what the verifier's per-call path costs where the op costs little."""
    return x * 2


def small_op(device: str) -> Callable[[], object]:
    x = torch.randn(8, 64, device=device)
    return lambda: [doubled(x) for _ in range(2000)]


def mlp(device: str) -> Callable[[], object]:
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    size = (4096, 11008) if device == "cuda" else (1024, 2752)  # 7B-shaped on the GPU, a quarter on a CPU
    w_gate, w_up = (torch.randn(size[1], size[0], device=device, generator=gen) / size[0] ** 0.5 for _ in range(2))
    w_down = torch.randn(size[0], size[1], device=device, generator=gen) / size[1] ** 0.5
    w_gate, w_up, w_down = (w.to(dtype) for w in (w_gate, w_up, w_down))
    x = torch.randn(16, size[0], device=device, generator=gen, dtype=dtype)
    return lambda: [linear(torch.nn.functional.silu(linear(x, w_gate)) * linear(x, w_up), w_down) for _ in range(8)]


def decode(device: str) -> Callable[[], object]:
    from replay_kernels.model import TinyLlama

    model = TinyLlama(device=device, use_cuda_graph=False)

    def run() -> object:
        model.reset()
        model.prefill(list(range(8)))
        return [model.decode_step(t) for t in range(32)]
    return run


def floor_hook(kind: str) -> Callable[..., object]:
    """A verifier hook that checks nothing: it calls the op, after waiting for the GPU ("sync") or
    reading where each tensor argument is and what it holds ("inspect": the least a gate that
    reads contents must do in Python), or and then its reference on the same arguments
    ("reference": what checking every call costs at the least; the model's ops that write in
    place write the same values again)."""
    def hook(spec: CallSpec, call: Callable[..., object], signature: inspect.Signature, args: tuple,
             kwargs: dict) -> object:
        if kind == "sync":
            torch.cuda.current_stream().synchronize()
        elif kind == "inspect":
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor):
                    value.data_ptr(), value.numel(), value.dtype  # read, as a gate must, and let go
        result = call(*args, **kwargs)
        if kind == "reference":
            get_op(spec.op).get("reference").fn(*args, **kwargs)
        return result
    return hook


class Modes:
    """Each mode's verification of the workload's ops, made at its first use and kept: switching
    modes swaps hooks, so a mode's state (its gate's statistics, its references' graphs, its
    sampling) runs on from one of its runs to the next, as in a program verified all along."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.hooks: dict[str, dict[str, Callable[..., object] | None]] = {}  # by the mode's repr
        self.policies: dict[str, list[Policy]] = {}

    def set(self, mode: object) -> None:
        eager = isinstance(mode, tuple) and mode[2:] == ("eager",)
        reference_graphs.GRAPH_DEVICES = () if eager else GRAPH_DEVICES
        key = repr(mode)  # (0.0, True) == (0.0, 1.0): the budgeted gate and the gate reading every call
        if key not in self.hooks:
            self.hooks[key] = {name: self._hook(name, mode) for name in self.names}
        for name in self.names:
            recorder.set_verifier(name, self.hooks[key][name])

    def _hook(self, name: str, mode: object) -> Callable[..., object] | None:
        if mode is None or isinstance(mode, str):
            return floor_hook(mode) if mode else None
        sample, outliers = (mode[0], mode[1]) if isinstance(mode, tuple) else (mode, True)
        policy = Policy(get_op(name), sample, None, outliers)  # type: ignore[arg-type]
        self.policies.setdefault(repr(mode), []).append(policy)
        return VERIFIER.hook(policy)

    def gate_share(self, mode: object) -> float | None:
        """The share of calls the mode's gates read now, where it follows their budget."""
        budgeted = [policy.gate_share for policy in self.policies.get(repr(mode), []) if policy.budgeted]
        return statistics.median(budgeted) if budgeted else None

    def close(self) -> None:
        for name in self.names:
            recorder.set_verifier(name, None)
        for policies in self.policies.values():
            for policy in policies:
                VERIFIER.retire(policy)


def timed(fn: Callable[[], object], device: str) -> float:
    """One run's wall time, its checks drained after."""
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    replay.verify.drain(60)
    return elapsed


def rare_bug(device: str, first: int, outliers: float | bool = 1.0, calls: int = 4000) -> str:
    """At sample 0.01 with the gate on (reading the share `outliers` of calls, or True: what its
    budget allows): a spike in one row from call `first` on, every third call; how many calls late
    the gate decided, and which call was caught."""
    reading = "what its budget allows" if outliers is True else f"{outliers:g} of calls"
    opened: list[int] = []
    open_window = Policy.open_window
    Policy.open_window = lambda self, n: (opened.append(self.calls()), open_window(self, n))  # type: ignore
    caught: list[int] = []
    replay.verify("bench_verify_spiky", sample=0.01, outliers=outliers, on_mismatch=lambda m: caught.append(m.call))
    gen = torch.Generator(device=device).manual_seed(first)
    try:
        for call in range(calls):
            x = torch.randn(16, 1024, device=device, generator=gen)
            if call >= first and (call - first) % 3 == 0:
                x[5, 100] = 80.0
            spiky_batched(x)
            if caught:
                break
        replay.verify.drain(60)
    finally:
        Policy.open_window = open_window  # type: ignore[method-assign]
        replay.verify.stop("bench_verify_spiky")
    after = [call for call in opened if call > first]  # a window opened before the spikes is no answer
    if not caught or not after:
        return f"gate reading {reading}, first spike at call {first}: not caught in {calls} calls"
    return (f"gate reading {reading}, first spike at call {first}: the gate decided after {after[0]} calls ({after[0] - first} calls after "
            f"the first spike), caught at call {caught[0]} (window {WINDOW} calls, from the call in flight; "
            f"{len(opened) - len(after)} windows opened before)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (a gate reading 1 call in 8 "
                        "needs a few runs of the tiny model to learn its kinds)")
    parser.add_argument("--modes", default="", help="only the modes whose label holds one of these comma-separated "
                        "texts (and 'off', and the floors the last row needs)")
    parser.add_argument("--workloads", default="", help="only the workloads whose name holds this text")
    parser.add_argument("--no-rare-bug", action="store_true", help="skip the planted rare bug")
    args = parser.parse_args()
    import replay_kernels  # noqa: F401  (registers the model's ops; the interpreter without a GPU)

    workloads = {"7B-shaped MLP, 16 rows x 8": (mlp(args.device), ("bench_verify_linear",)),
                 "one small op x 2000": (small_op(args.device), ("bench_verify_small",))}
    if args.device == "cuda":  # on a CPU the model's kernels run in the Triton interpreter: no timing to speak of
        workloads["tiny model: prefill 8 + decode 32"] = (decode(args.device), tuple(replay_kernels.OPS))
    workloads = {name: work for name, work in workloads.items() if args.workloads in name}
    wanted = [text for text in args.modes.split(",") if text]
    needed = {"off", MODES[1][0], MODES[3][0]}  # the baseline, and the floor at sample 0.01's terms
    modes = [(label, mode) for label, mode in MODES if (args.device == "cuda" or mode != "sync")
             and (not wanted or label in needed or any(text in label for text in wanted))]
    times: dict[str, list[list[float]]] = {label: [[] for _ in workloads] for label, _ in modes}
    ratios: dict[str, list[list[float]]] = {label: [[] for _ in workloads] for label, _ in modes}
    checks: dict[str, list[str]] = {}  # per mode and workload: checks (of them flagged) per run
    with tempfile.TemporaryDirectory() as tmp:
        replay.verify.configure(directory=tmp, seed=0)
        for w, (name, (fn, names)) in enumerate(workloads.items()):
            counted: dict[str, dict[str, float]] = {label: {} for label, _ in modes}
            verified = Modes(names)
            for round in range(-args.warmup, args.runs):  # rounds before 0 untimed: every mode warmed up
                # no mode always follows another; its unverified partner runs before it or after, by turns
                for turn, (label, mode) in enumerate(random.Random(round).sample(modes, len(modes))):
                    mine = (round + turn) % 2  # the mode's run's place in its pair
                    elapsed = []
                    for place, this_mode in enumerate((modes[0][1], mode) if mine else (mode, modes[0][1])):
                        verified.set(this_mode)
                        gc.collect()  # the garbage of the mode before is not this one's to collect
                        before = replay.verify.counters()
                        elapsed.append(timed(fn, args.device))
                        if round >= 0 and place == mine:
                            for key, value in replay.verify.counters().items():
                                counted[label][key] = counted[label].get(key, 0) + (value - before[key]) / args.runs
                    if round >= 0:
                        times[label][w].append(elapsed[mine])
                        ratios[label][w].append(elapsed[mine] / elapsed[1 - mine])
            for label, mode in modes:
                done, share = counted[label], verified.gate_share(mode)
                checks.setdefault(label, []).append(
                    (f"; {done['checked']:.1f} checks/run, {done['flagged']:.1f} flagged of {done['calls']:.0f} calls"
                     if done["checked"] or done["flagged"] else "") + (f"; the gate reads {share:.3f}" if share else ""))
            verified.close()
        bugs = [] if args.no_rare_bug else \
            [rare_bug(args.device, first, share) for share in (1.0, True, 0.125) for first in (500, 1000, 2000)]
    medians = {label: [statistics.median(runs) for runs in row] for label, row in times.items()}
    paired = {label: [statistics.median(runs) for runs in row] for label, row in ratios.items()}
    # the mean too: the "off" row's says how far two unverified runs stray, and a rare costly check
    # (a kind's first sighting, a capture) moves a mean where a median does not show it
    means = {label: [statistics.fmean(runs) for runs in row] for label, row in ratios.items()}
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; torch {torch.__version__}\n")
    print("| mode | " + " | ".join(f"{name}: ms (x off, paired: median; mean)" for name in workloads) + " |")
    print("| --- | " + " | ".join("---:" for _ in workloads) + " |")
    for label, row in medians.items():
        print(f"| {label} | " + " | ".join(f"{t * 1e3:.2f} ({ratio:.3f}x; {mean:.3f}x{done})" for t, ratio, mean, done
                                           in zip(row, paired[label], means[label], checks[label])) + " |")
    # checking a share s of calls costs at least s times what running the reference after every call adds
    floor = [1 + 0.01 * (ref - hook) for ref, hook in zip(paired[MODES[3][0]], paired[MODES[1][0]])]
    print("| floor at sample 0.01: 1% of the reference's own cost | "
          + " | ".join(f"{t * off * 1e3:.2f} ({t:.3f}x)" for t, off in zip(floor, medians["off"])) + " |")
    if bugs:
        print("\nplanted rare bug, sample 0.01, gate on:\n" + "\n".join(f"- {line}" for line in bugs))
    print(f"\ncounters: {replay.verify.counters()}; references' graphs captured: {VERIFIER.graphs.captures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
