"""ReadPlan's cursor: where a plan's readers are, learnt from the reads alone."""

from __future__ import annotations

import random

from spoke.prefetch.plans import ReadPlan

SAMPLES = 64  # one object, one chunk per sample: the cursor is all that is checked


def epochs(count: int, seed: int) -> list[int]:
    """Sample offsets of ``count`` shuffled epochs, in read order."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(count):
        epoch = list(range(SAMPLES))
        rng.shuffle(epoch)
        order += epoch
    return order


def plan_of(order: list[int]) -> ReadPlan:
    names = [f"chunk-{sample}" for sample in range(SAMPLES)]
    return ReadPlan("p", [(0, sample) for sample in order], [[sample] for sample in order],
                    names, {})


def test_an_in_order_reader_is_followed_across_epoch_boundaries() -> None:
    # Early in an epoch, samples read late in the epoch before come again: those reads
    # are this epoch's, and the cursor must move with them.
    order = epochs(4, seed=3)
    plan = plan_of(order)
    lagging = []
    for position, sample in enumerate(order):
        plan.observe(0, sample)
        if plan.cursor != position:
            lagging.append(position)
    assert lagging == []


def test_late_workers_do_not_move_the_cursor_back_or_into_the_next_epoch() -> None:
    order = epochs(3, seed=4)
    plan = plan_of(order)
    for sample in order[:40]:
        plan.observe(0, sample)
    assert plan.cursor == 39
    for sample in order[30:39]:  # late answers for reads the cursor passed
        plan.observe(0, sample)
        assert plan.cursor == 39
    plan.observe(0, order[39])  # the read at the cursor, again (a retry)
    assert plan.cursor == 39
