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
