"""PrioritySlots: a semaphore where demand always goes before background work;
Backlog: a bound on work waiting for a later stage.

Hub fetches for a loader waiting on a read are *demand*; pre-warm and read-ahead
fetches are *background*. Background work may use at most ``background_limit``
slots and never takes a slot while demand is waiting, so prefetch can only use
the link's spare capacity. A background :class:`SlotClaim` that a loader comes to
wait on (it joined a read-ahead fetch) is :meth:`~PrioritySlots.promote`\\ d: it
queues, or counts, as demand from then on.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress


class SlotClaim:
    """One wish for a slot, from asking until release."""

    __slots__ = ("background", "held", "held_background", "waiter")

    def __init__(self, background: bool) -> None:
        self.background = background
        self.waiter: asyncio.Future[None] | None = None
        self.held = False
        self.held_background = False


class PrioritySlots:
    def __init__(self, capacity: int, background_limit: int) -> None:
        if capacity < 1 or background_limit < 1:
            raise ValueError("capacity and background_limit must be at least 1")
        self.capacity = capacity
        self.background_limit = min(background_limit, capacity)
        self.in_use = 0
        self.background_in_use = 0
        self._demand: deque[SlotClaim] = deque()
        self._background: deque[SlotClaim] = deque()

    @asynccontextmanager
    async def slot(
        self, *, background: bool = False, claim: SlotClaim | None = None
    ) -> AsyncIterator[None]:
        """Hold a slot for the block; ``claim`` (made by the caller) can be promoted meanwhile."""
        claim = claim if claim is not None else SlotClaim(background)
        await self.take(claim)
        try:
            yield
        finally:
            self.give_back(claim)

    async def acquire(self, *, background: bool = False) -> None:
        await self.take(SlotClaim(background))

    def release(self, *, background: bool = False) -> None:
        self.in_use -= 1
        if background:
            self.background_in_use -= 1
        self._wake()

    async def take(self, claim: SlotClaim) -> None:
        if self._may_take(claim.background):
            self._take(claim)
            return
        claim.waiter = asyncio.get_running_loop().create_future()
        (self._background if claim.background else self._demand).append(claim)
        try:
            await claim.waiter  # _wake() takes the slot on our behalf before resolving
        except asyncio.CancelledError:
            if claim.held:
                self.give_back(claim)  # woken and cancelled at once
            else:
                self._forget(claim)
            raise
        finally:
            claim.waiter = None

    def give_back(self, claim: SlotClaim) -> None:
        if not claim.held:
            return
        claim.held = False
        self.release(background=claim.held_background)

    def promote(self, claim: SlotClaim) -> None:
        """A loader now waits on ``claim``'s work: from now on it counts as demand."""
        if not claim.background:
            return
        claim.background = False
        if claim.held:
            if claim.held_background:
                claim.held_background = False
                self.background_in_use -= 1
        elif claim.waiter is not None:
            self._background.remove(claim)
            self._demand.append(claim)
        self._wake()

    def _forget(self, claim: SlotClaim) -> None:
        for queue in (self._demand, self._background):
            if claim in queue:
                queue.remove(claim)

    def _may_take(self, background: bool) -> bool:
        if self.in_use >= self.capacity:
            return False
        if not background:
            return True
        return not self._demand and self.background_in_use < self.background_limit

    def _take(self, claim: SlotClaim) -> None:
        self.in_use += 1
        claim.held = True
        claim.held_background = claim.background
        if claim.background:
            self.background_in_use += 1

    def _wake(self) -> None:
        while self._demand and self.in_use < self.capacity:
            self._hand_over(self._demand.popleft())
        while self._background and self._may_take(True):
            self._hand_over(self._background.popleft())

    def _hand_over(self, claim: SlotClaim) -> None:
        if claim.waiter is None or claim.waiter.done():
            return
        self._take(claim)
        claim.waiter.set_result(None)


class Backlog:
    """How many items are in a later stage of work, and a bound new work waits under.

    A verified chunk is served from memory while it is being stored, so its
    readers do not wait on the disk; the bound keeps a disk slower than the WAN
    from holding every fetched chunk in memory: new fetches wait for room instead.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.count = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def room(self) -> None:
        """Until fewer than ``limit`` items are in the later stage."""
        while self.count >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with suppress(ValueError):
                    self._waiters.remove(waiter)

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        # Everyone waiting looks again: the first few get in, the rest wait anew.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
