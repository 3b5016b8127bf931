"""UnforeseenReuse: what holding a chunk for the re-reads no plan announced is worth."""

from __future__ import annotations

import math

from spoke.policy.reuse import PLANNED, UNPLANNED, UnforeseenReuse

FAR = 1e9  # a planned use further than anything the tests compare with


def test_reads_that_come_when_the_plan_said_teach_nothing() -> None:
    reuse: UnforeseenReuse[int] = UnforeseenReuse()
    for _ in range(20):  # every key read again exactly as planned, 100 reads later
        for key in range(100):
            reuse.read(key, 100.0, entries=1_000)
    assert reuse.unforeseen == 0
    assert reuse.offer(PLANNED, FAR) == (0, math.inf)
    assert reuse.offer(UNPLANNED, FAR) == (0, math.inf)


def test_a_retry_three_reads_later_is_worth_a_window_of_four() -> None:
    reuse: UnforeseenReuse[int] = UnforeseenReuse()
    for key in range(2_000):  # every fourth read retries the read three before it
        reuse.read(key, FAR, entries=1_000)
        if key % 4 == 3:
            reuse.read(key - 2, FAR, entries=1_000)
    assert reuse.unforeseen > 0
    window, cost = reuse.offer(PLANNED, FAR)
    assert window == 4
    # Each life held 4 reads for a hit in about one life in five: ~20 reads of room a hit.
    assert 15 < cost < 25
    assert reuse.offer(PLANNED, cost / 2) == (0, math.inf)  # not worth it against sooner uses
    # The other class saw no re-read of its own: it goes by both together.
    assert reuse.offer(UNPLANNED, FAR) == (window, cost)


def test_unplanned_chunks_learn_their_own_window() -> None:
    reuse: UnforeseenReuse[int] = UnforeseenReuse()
    for _ in range(200):  # a set of 8 unplanned chunks read over and over
        for key in range(8):
            reuse.read(key, math.inf, entries=1_000)
    window, cost = reuse.offer(UNPLANNED, FAR)
    assert window == 8 and math.isclose(cost, 8.0, rel_tol=0.05)  # a hit per 8 reads held


def test_each_class_with_re_reads_of_its_own_keeps_its_own_window() -> None:
    reuse: UnforeseenReuse[int] = UnforeseenReuse()
    for round_ in range(200):
        for key in range(8):  # unplanned chunks, back every 8 reads of theirs
            reuse.read(key, math.inf, entries=1_000)
            planned = 100 + 8 * round_ + key  # and planned ones, retried once, 2 reads on
            reuse.read(planned, FAR, entries=1_000)
            if key % 2:
                reuse.read(planned - 1, FAR, entries=1_000)
    assert reuse.offer(PLANNED, FAR)[0] == 4  # ages 3 and 4 (the retry, 2 reads apart)
    assert reuse.offer(UNPLANNED, FAR)[0] == 32  # 20 reads between two of the same chunk


def test_the_ghost_is_bounded_by_the_cache_entries() -> None:
    reuse: UnforeseenReuse[int] = UnforeseenReuse(floor=64)
    for key in range(10_000):
        reuse.read(key, math.inf, entries=100)
    assert len(reuse._ghost) == 100
    for key in range(0, 10_000, 50):  # read long ago: out of the ghost, not a re-read
        reuse.read(key, math.inf, entries=100)
    assert reuse.unforeseen == 0
