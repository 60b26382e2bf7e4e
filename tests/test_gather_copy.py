"""The graph staging's copy kernel (replay/recorder/gather_copy.py): every row's bytes land where
its table says, by words or by bytes as the addresses allow, into the ring slot its counter names,
and a launch that turns the ring moves the counter on once however many programs it has. On a GPU
on the device; here in Triton's interpreter."""
from __future__ import annotations

import torch

from replay.recorder import gather_copy


def _copies(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """A source of random bytes, a destination and a 3-slot ring, and (source offset, destination
    offset, bytes) copies: aligned, odd lengths, odd addresses, one longer than a row."""
    gen = torch.Generator().manual_seed(0)
    source = torch.randint(0, 256, (40000,), generator=gen, dtype=torch.uint8).to(device)
    copies = [(0, 0, 64), (64, 64, 20000), (20067, 20100, 13), (20081, 20121, 1), (20900, 20200, 19003)]
    return source, torch.zeros(40000, dtype=torch.uint8, device=device), \
        torch.zeros(3, 40000, dtype=torch.uint8, device=device), copies


def _table(source: torch.Tensor, into: torch.Tensor, ring: torch.Tensor,
           copies: list[tuple[int, int, int]]) -> torch.Tensor:
    rows = [row for at, to, n in copies
            for row in gather_copy.rows(source.data_ptr() + at, into.data_ptr() + to, n,
                                        ring.data_ptr() + to, ring.stride(0))]
    return torch.tensor(rows, dtype=torch.int64, device=source.device)


def test_every_row_lands_in_its_destination_and_the_ring_slot_the_counter_names(device: str) -> None:
    source, into, ring, copies = _copies(device)
    table = _table(source, into, ring, copies)
    assert table.shape[0] > len(copies)  # the long copies take several rows (programs)
    counter = gather_copy.new_counter(torch.device(device))
    for turn in range(4):
        source.add_(1)  # new bytes a turn
        gather_copy.launch(table, counter, 3, advance=turn != 1)  # the second launch leaves the ring where it is
        for at, to, n in copies:
            assert torch.equal(into[to:to + n], source[at:at + n])
            slot = [0, 1, 1, 2][turn]
            assert torch.equal(ring[slot, to:to + n], source[at:at + n]), (turn, at)
        assert counter.tolist() == [[1, 1, 2, 3][turn], 0]  # the arrivals back at 0 for the next launch
    assert int(into[20100 + 13:20121].count_nonzero()) == 0  # nothing between the copies is written


def test_the_host_copy_does_what_the_kernel_does() -> None:
    kernel, host = (_copies("cpu") for _ in range(2))
    for (source, into, ring, copies), launch in ((kernel, gather_copy.launch), (host, gather_copy.copy_rows_on_host)):
        counter = gather_copy.new_counter(torch.device("cpu"))
        table = _table(source, into, ring, copies)
        launch(table, counter, 3, True)
        launch(table, counter, 3, True)
    assert torch.equal(kernel[1], host[1]) and torch.equal(kernel[2], host[2])
    assert int(kernel[2][2].count_nonzero()) == 0  # two turns: slots 0 and 1


def test_fixed_copies_read_each_launchs_own_sources(device: str) -> None:
    """A table made once for fixed destinations (one empty, one past a row, odd lengths) copies
    from wherever the sources are at each launch."""
    sizes = [64, 0, 20001, 13]
    destinations = [torch.zeros(n, dtype=torch.uint8, device=device) for n in sizes]
    copies = gather_copy.FixedCopies([(d.data_ptr(), d.numel()) for d in destinations], torch.device(device))
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):  # new tensors each time: new addresses
        sources = [torch.randint(0, 256, (n + 3,), generator=gen, dtype=torch.uint8).to(device)[3:] for n in sizes]
        copies.launch([s.data_ptr() for s in sources])
        for source, destination in zip(sources, destinations):
            assert torch.equal(source, destination)
