"""Where the first bad commit can still be, and which commits to probe next.

Pure logic over a commit graph, no git. The suspects are the ancestors of the
best-known bad commit that are not ancestors of any good one; a commit's weight
is how many suspects it has as ancestors (itself included), which is how many
remain if it tests bad. Probing the commits whose weights sit at the K quantiles
of the suspects splits them into K+1 parts, so a linear range of n commits takes
ceil(log_{K+1} n) rounds; on a merge-heavy graph it is the same rule, as git
bisect's "halfway by ancestor count" is for K = 1. A skipped commit stays a
suspect but is never picked again: the nearest weight goes instead, which is how
git bisect steps around it.

Ancestor sets are Python ints used as bitsets: n commits cost n*n/2 bits
(10 000 commits, 6 MB).
"""
from __future__ import annotations

from dataclasses import dataclass

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class CommitGraph:
    """A range of commits, parents before children; the last one is the known-bad tip.

    `parents[i]` are the indices of commit i's parents inside the range.
    """

    shas: tuple[str, ...]
    parents: tuple[tuple[int, ...], ...]

    def __len__(self) -> int:
        return len(self.shas)


@dataclass(frozen=True)
class Outcome:
    """The search's answer: one first bad commit, or the candidates skips left open."""

    first_bad: int | None
    candidates: tuple[int, ...]  # the commits that may be first bad, oldest first


class BisectSearch:
    def __init__(self, graph: CommitGraph) -> None:
        if not graph.shas:
            raise ValueError("an empty range has nothing to bisect")
        self.graph = graph
        self._ancestors = _ancestor_bitsets(graph)
        self.verdicts: dict[int, str] = {len(graph) - 1: BAD}

    def record(self, index: int, verdict: str) -> None:
        if verdict not in (GOOD, BAD, SKIP):
            raise ValueError(f"unknown verdict {verdict!r}")
        self.verdicts[index] = verdict

    def suspects(self) -> tuple[int, int]:
        """(the bad commit with the fewest suspects below it, those suspects as a bitset)."""
        goods = [g for g, v in self.verdicts.items() if v == GOOD]
        best: tuple[int, int, int] | None = None
        for bad in (b for b, v in self.verdicts.items() if v == BAD):
            mask = self._ancestors[bad] & ~self._good_ancestors(goods, bad)
            key = (mask.bit_count(), bad, mask)
            best = key if best is None or key < best else best
        assert best is not None  # the tip is always bad
        return best[1], best[2]

    def _good_ancestors(self, goods: list[int], bad: int) -> int:
        # A good commit that descends from `bad` contradicts it (a flaky test); it
        # says nothing about this bad commit's ancestors, so it is left out here.
        mask = 0
        for good in goods:
            if not self._ancestors[good] >> bad & 1:
                mask |= self._ancestors[good]
        return mask

    def remaining(self) -> int:
        """How many commits may still be the first bad one."""
        return self.suspects()[1].bit_count()

    def next_batch(self, k: int) -> list[int]:
        """Up to k untested suspects splitting the suspects into k+1 equal parts; [] when done."""
        _, mask = self.suspects()
        untested = [i for i in _bits(mask) if i not in self.verdicts]
        total = mask.bit_count()
        weight = {i: (self._ancestors[i] & mask).bit_count() for i in untested}
        batch: list[int] = []
        for quantile in range(1, k + 1):
            target = quantile * total / (k + 1)
            choices = [i for i in untested if i not in batch]
            if not choices:
                break
            batch.append(min(choices, key=lambda i: (abs(weight[i] - target), weight[i])))
        return sorted(batch)

    def outcome(self) -> Outcome:
        """Meaningful once next_batch returns []: skipped suspects make it ambiguous."""
        bad, mask = self.suspects()
        skipped = [i for i in _bits(mask) if self.verdicts.get(i) == SKIP]
        if skipped:
            return Outcome(None, tuple(sorted(skipped + [bad])))
        return Outcome(bad, (bad,))

    def contradictions(self) -> list[tuple[int, int]]:
        """(good, bad) pairs where a good commit descends from a bad one: the test is not monotone."""
        return [(g, b) for g, vg in self.verdicts.items() if vg == GOOD
                for b, vb in self.verdicts.items() if vb == BAD and self._ancestors[g] >> b & 1]


def _ancestor_bitsets(graph: CommitGraph) -> list[int]:
    ancestors: list[int] = []
    for i, parents in enumerate(graph.parents):
        mask = 1 << i
        for p in parents:
            if p >= i:
                raise ValueError(f"commit {i} lists parent {p}: parents must come first")
            mask |= ancestors[p]
        ancestors.append(mask)
    return ancestors


def _bits(mask: int) -> list[int]:
    return [i for i, bit in enumerate(reversed(bin(mask)[2:])) if bit == "1"]
