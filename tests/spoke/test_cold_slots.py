"""PrioritySlots: read-ahead yields to loaders, and a read-ahead a loader joins stops yielding.
Backlog: new work waits while the later stage is full."""

from __future__ import annotations

import asyncio

import pytest

from spoke.cache.slots import Backlog, PrioritySlots, SlotClaim


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_demand_goes_before_background_work_waiting_longer() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1)
    first = SlotClaim(background=False)
    await slots.take(first)
    background = asyncio.create_task(slots.take(SlotClaim(background=True)))
    await settle()
    demand = asyncio.create_task(slots.take(SlotClaim(background=False)))
    await settle()
    slots.give_back(first)
    await settle()
    assert demand.done() and not background.done()
    assert (slots.in_use, slots.background_in_use) == (1, 0)
    background.cancel()


async def test_a_waiting_background_claim_promoted_takes_a_slot_background_may_not() -> None:
    slots = PrioritySlots(capacity=3, background_limit=1)
    ahead = SlotClaim(background=True)
    await slots.take(ahead)  # the one background slot
    joined = SlotClaim(background=True)
    waiting = asyncio.create_task(slots.take(joined))
    await settle()
    assert not waiting.done()  # a slot is free, but background work is at its limit
    slots.promote(joined)  # a loader now waits on this fetch
    await settle()
    assert waiting.done() and joined.held and not joined.held_background
    assert (slots.in_use, slots.background_in_use) == (2, 1)
    slots.give_back(joined)
    slots.give_back(ahead)
    assert (slots.in_use, slots.background_in_use) == (0, 0)


async def test_a_held_background_slot_promoted_frees_the_background_quota() -> None:
    slots = PrioritySlots(capacity=2, background_limit=1)
    joined = SlotClaim(background=True)
    await slots.take(joined)
    other = asyncio.create_task(slots.take(SlotClaim(background=True)))
    await settle()
    assert not other.done()
    slots.promote(joined)
    await settle()
    assert other.done()
    assert (slots.in_use, slots.background_in_use) == (2, 1)
    slots.give_back(joined)  # released as the demand it became
    assert (slots.in_use, slots.background_in_use) == (1, 1)


async def test_a_cancelled_wait_leaves_no_slot_taken() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1)
    holder = SlotClaim(background=False)
    await slots.take(holder)
    claim = SlotClaim(background=True)
    waiting = asyncio.create_task(slots.take(claim))
    await settle()
    slots.promote(claim)
    waiting.cancel()
    await settle()
    slots.give_back(holder)
    assert (slots.in_use, slots.background_in_use, claim.held) == (0, 0, False)


async def test_a_backlog_at_its_limit_holds_new_work_until_an_item_leaves() -> None:
    backlog = Backlog(limit=2)
    await backlog.room()  # empty: no wait
    backlog.enter()
    backlog.enter()
    first = asyncio.create_task(backlog.room())
    gone = asyncio.create_task(backlog.room())
    await settle()
    assert not first.done() and not gone.done()
    gone.cancel()
    await settle()
    backlog.leave()
    await settle()
    assert first.done() and backlog.count == 1
    # The cancelled waiter left nothing behind to wake.
    assert not backlog._waiters


def test_a_backlog_needs_room_for_one() -> None:
    with pytest.raises(ValueError):
        Backlog(limit=0)


async def _served_order(slots: PrioritySlots, claims: list[SlotClaim]) -> list[int]:
    """Queue ``claims`` (in list order) behind the one slot, then free it again and
    again: the order their waits end in, as list positions."""
    holder = SlotClaim(background=False)
    await slots.take(holder)
    served: list[int] = []

    async def wait(i: int, claim: SlotClaim) -> None:
        await slots.take(claim)
        served.append(i)

    tasks = [asyncio.create_task(wait(i, c)) for i, c in enumerate(claims)]
    await settle()
    current = holder
    for _ in claims:
        assert len(served) < len(claims)
        slots.give_back(current)
        await settle()
        current = claims[served[-1]]
    slots.give_back(current)
    await asyncio.gather(*tasks)
    return served


async def test_waiting_demand_goes_in_rank_order_and_unranked_in_arrival_order() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1, patience=100)
    ranks = [60.0, 5.0, 30.0, float("-inf"), 7.0, float("-inf")]
    served = await _served_order(slots, [SlotClaim(False, rank) for rank in ranks])
    # Unranked claims (no plan: needed now) first, in arrival order; then by plan order.
    assert served == [3, 5, 1, 4, 2, 0]


async def test_the_oldest_waiting_claim_is_overtaken_at_most_patience_times() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1, patience=2)
    # The first comes last by rank; each later one ranks better than all before it.
    ranks = [100.0, 9.0, 8.0, 7.0, 6.0, 5.0]
    served = await _served_order(slots, [SlotClaim(False, rank) for rank in ranks])
    assert served.index(0) == 2  # two hand-overs past it, then its turn
    # Without the bound it would have gone last.
    assert await _served_order(PrioritySlots(1, 1, patience=100),
                               [SlotClaim(False, rank) for rank in ranks]) == [5, 4, 3, 2, 1, 0]


async def test_a_promoted_background_claim_queues_at_its_rank() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1, patience=100)
    holder = SlotClaim(background=False)
    await slots.take(holder)
    late = SlotClaim(False, 50.0)
    prefetch = SlotClaim(True)
    waits = [asyncio.create_task(slots.take(c)) for c in (late, prefetch)]
    await settle()
    slots.promote(prefetch, 10.0)  # a loader joined it: needed before ``late``
    slots.give_back(holder)
    await settle()
    assert prefetch.held and not late.held
    slots.give_back(prefetch)
    await asyncio.gather(*waits)
    assert late.held


async def test_a_cancelled_ranked_wait_is_skipped() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1)
    holder = SlotClaim(background=False)
    await slots.take(holder)
    gone, kept = SlotClaim(False, 1.0), SlotClaim(False, 2.0)
    waits = [asyncio.create_task(slots.take(c)) for c in (gone, kept)]
    await settle()
    waits[0].cancel()
    await settle()
    slots.give_back(holder)
    await settle()
    assert kept.held and not gone.held and slots.in_use == 1
    slots.give_back(kept)
    assert slots.in_use == 0


async def test_a_borrowing_background_claim_takes_idle_slots_beyond_the_share() -> None:
    slots = PrioritySlots(capacity=3, background_limit=1)
    await slots.take(SlotClaim(True))  # the background share, used up
    plain = asyncio.create_task(slots.take(SlotClaim(True)))
    borrowers = [SlotClaim(True, borrows=True) for _ in range(2)]
    for claim in borrowers:
        await slots.take(claim)  # no wait: the slots are idle
    await settle()
    assert not plain.done() and slots.in_use == 3
    # But never while a loader waits: the freed slot goes to it.
    demand = asyncio.create_task(slots.take(SlotClaim(False)))
    late = asyncio.create_task(slots.take(SlotClaim(True, borrows=True)))
    await settle()
    slots.give_back(borrowers[0])
    await settle()
    assert demand.done() and not late.done() and not plain.done()
    plain.cancel()
    late.cancel()


async def test_a_plans_prefetch_waits_among_the_demand_at_its_rank() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1, patience=100)
    claims = [SlotClaim(False, 20.0),  # a loader's read of a later batch
              SlotClaim(True, 10.0, borrows=True),  # the plan's next chunk, not asked for
              SlotClaim(True, 5.0),  # plain background work: after every demand
              SlotClaim(False)]  # a read no plan knows of: needed now
    assert await _served_order(slots, claims) == [3, 1, 0, 2]


async def test_a_waiting_prefetch_promoted_moves_up_to_its_new_rank() -> None:
    slots = PrioritySlots(capacity=1, background_limit=1, patience=100)
    holder = SlotClaim(background=False)
    await slots.take(holder)
    demand, prefetch = SlotClaim(False, 20.0), SlotClaim(True, 30.0, borrows=True)
    waits = [asyncio.create_task(slots.take(c)) for c in (demand, prefetch)]
    await settle()
    slots.promote(prefetch, 15.0)  # a loader of an earlier read joined it
    slots.give_back(holder)
    await settle()
    assert prefetch.held and not prefetch.held_background and not demand.held
    slots.give_back(prefetch)
    await asyncio.gather(*waits)
    assert demand.held and (slots.in_use, slots.background_in_use) == (1, 0)
