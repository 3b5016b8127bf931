"""PrioritySlots: a semaphore where demand always goes before background work;
Backlog: a bound on work waiting for a later stage.

Hub fetches for a loader waiting on a read are *demand*; pre-warm and read-ahead
fetches are *background*. Background work may use at most ``background_limit``
slots and never takes a slot while demand is waiting, so prefetch can only use
the link's spare capacity. A background :class:`SlotClaim` that a loader comes to
wait on (it joined a read-ahead fetch) is :meth:`~PrioritySlots.promote`\\ d: it
queues, or counts, as demand from then on.

Waiting demand goes soonest-needed first (:class:`DemandQueue`): a claim's ``rank``
is when its chunk is needed (a read plan's order), so the batch a loader waits on
now is fetched before the ones its other workers asked for at the same moment.
A background claim that ``borrows`` (a plan's prefetch) may take any free slot, not
only the background share, while no demand waits: those chunks are the next demand.
Ranked by the plan, it waits among the demand, at its rank: a loader's read of the
batch after next does not go before the plan's fetch of a chunk of the next batch
(one that no loader asked for yet; a loader's answer reads its chunks in turn).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress


class SlotClaim:
    """One wish for a slot, from asking until release; ``rank``: the lower, the sooner
    its work is needed (among waiting demand; ``-inf``, the default, is "now": in order
    of arrival ahead of any ranked claim)."""

    __slots__ = ("background", "borrows", "held", "held_background", "rank", "ticket",
                 "waiter")

    def __init__(self, background: bool, rank: float = -math.inf, *,
                 borrows: bool = False) -> None:
        self.background = background
        self.borrows = borrows
        self.rank = rank
        self.waiter: asyncio.Future[None] | None = None
        self.held = False
        self.held_background = False
        self.ticket = 0  # its place in the demand queue (0: not in it)


class DemandQueue:
    """Waiting demand claims, lowest ``rank`` first and, among equals, oldest first.

    Nothing waits for ever behind better-ranked newcomers: once ``patience`` claims
    have been handed a slot since the oldest waiting claim began to wait, that one
    goes next. So a claim waits at most for the claims older than it plus
    ``patience`` hand-overs.
    """

    def __init__(self, patience: int) -> None:
        self.patience = max(1, patience)
        self._by_rank: list[tuple[float, int, SlotClaim]] = []
        self._by_age: deque[tuple[int, int, SlotClaim]] = deque()  # (ticket, handed, claim)
        self._tickets = 0
        self._handed = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def push(self, claim: SlotClaim) -> None:
        self._tickets += 1
        claim.ticket = self._tickets
        heapq.heappush(self._by_rank, (claim.rank, claim.ticket, claim))
        self._by_age.append((claim.ticket, self._handed, claim))
        self._count += 1

    def remove(self, claim: SlotClaim) -> None:
        """Take ``claim`` out (its entries are dropped lazily, as they come up)."""
        if claim.ticket:
            claim.ticket = 0
            self._count -= 1
            if not self._count:
                self._by_rank.clear()
                self._by_age.clear()

    def pop(self) -> SlotClaim:
        """The claim to hand the next free slot to."""
        by_age = self._by_age
        while by_age and by_age[0][2].ticket != by_age[0][0]:
            by_age.popleft()
        if by_age and self._handed - by_age[0][1] >= self.patience:
            claim = by_age.popleft()[2]
        else:
            while True:
                _, ticket, claim = heapq.heappop(self._by_rank)
                if claim.ticket == ticket:
                    break
        self.remove(claim)
        self._handed += 1
        return claim


class PrioritySlots:
    def __init__(self, capacity: int, background_limit: int, patience: int | None = None) -> None:
        """``patience``: how many better-ranked claims may overtake the oldest waiting
        demand (:class:`DemandQueue`); by default twice the capacity, about two rounds
        of fetches."""
        if capacity < 1 or background_limit < 1:
            raise ValueError("capacity and background_limit must be at least 1")
        self.capacity = capacity
        self.background_limit = min(background_limit, capacity)
        self.in_use = 0
        self.background_in_use = 0
        self._demand = DemandQueue(2 * capacity if patience is None else patience)
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
        if self._may_take(claim):
            self._take(claim)
            return
        claim.waiter = asyncio.get_running_loop().create_future()
        if claim.background and not (claim.borrows and claim.rank > -math.inf):
            self._background.append(claim)
        else:
            self._demand.push(claim)
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

    def promote(self, claim: SlotClaim, rank: float = -math.inf) -> None:
        """A loader now waits on ``claim``'s work, needed at ``rank``: from now on it
        counts as demand."""
        if not claim.background:
            return
        claim.background = False
        claim.rank = rank
        if claim.held:
            if claim.held_background:
                claim.held_background = False
                self.background_in_use -= 1
        elif claim.waiter is not None:
            if claim.ticket:  # a plan's prefetch, waiting at its rank already
                self._demand.remove(claim)
            else:
                self._background.remove(claim)
            self._demand.push(claim)
        self._wake()

    def _forget(self, claim: SlotClaim) -> None:
        self._demand.remove(claim)
        if claim in self._background:
            self._background.remove(claim)

    def _may_take(self, claim: SlotClaim) -> bool:
        if self.in_use >= self.capacity:
            return False
        if not claim.background:
            return True
        if self._demand:
            return False
        return claim.borrows or self.background_in_use < self.background_limit

    def _take(self, claim: SlotClaim) -> None:
        self.in_use += 1
        claim.held = True
        claim.held_background = claim.background
        if claim.background:
            self.background_in_use += 1

    def _wake(self) -> None:
        while self._demand and self.in_use < self.capacity:
            self._hand_over(self._demand.pop())
        if self._background and self.in_use < self.capacity and not self._demand:
            # In order of arrival; one at its share lets borrowers behind it by.
            for claim in list(self._background):
                if self._may_take(claim):
                    self._background.remove(claim)
                    self._hand_over(claim)

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
