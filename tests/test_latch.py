"""The recorder's one-shot signal (replay/recorder/latch.py): waiters are held until it is set,
then every one goes on, however sets and waits interleave."""
from __future__ import annotations

import threading

from replay.recorder.latch import Latch


def _waiters(latch: Latch, count: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=latch.wait, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_waiters_are_held_until_set_then_all_go_on() -> None:
    latch = Latch()
    threads = _waiters(latch, 4)
    for thread in threads:
        thread.join(0.05)
    assert not latch.is_set() and all(thread.is_alive() for thread in threads)
    latch.set()
    for thread in threads:
        thread.join(5)
    assert latch.is_set() and not any(thread.is_alive() for thread in threads)
    latch.wait()  # after it is set: at once, as often as asked
    latch.set()
    latch.wait()


def test_racing_sets_and_waits_never_leave_a_waiter_behind() -> None:
    for _ in range(200):
        latch = Latch()
        waiters = _waiters(latch, 3)
        setters = [threading.Thread(target=latch.set, daemon=True) for _ in range(2)]
        for setter in setters:
            setter.start()
        waiters += _waiters(latch, 2)  # some come after a set, some during
        for thread in waiters + setters:
            thread.join(5)
        assert not any(thread.is_alive() for thread in waiters + setters)
        latch.wait()
