"""PrioritySlots: a semaphore where demand always goes before background work.

Hub fetches for a loader waiting on a read are *demand*; pre-warm and read-ahead
fetches are *background*. Background work may use at most ``background_limit``
slots and never takes a slot while demand is waiting, so prefetch can only use
the link's spare capacity.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class PrioritySlots:
    def __init__(self, capacity: int, background_limit: int) -> None:
        if capacity < 1 or background_limit < 1:
            raise ValueError("capacity and background_limit must be at least 1")
        self.capacity = capacity
        self.background_limit = min(background_limit, capacity)
        self.in_use = 0
        self.background_in_use = 0
        self._demand: deque[asyncio.Future[None]] = deque()
        self._background: deque[asyncio.Future[None]] = deque()

    @asynccontextmanager
    async def slot(self, *, background: bool = False) -> AsyncIterator[None]:
        await self.acquire(background=background)
        try:
            yield
        finally:
            self.release(background=background)

    async def acquire(self, *, background: bool = False) -> None:
        if self._may_take(background):
            self._take(background)
            return
        waiters = self._background if background else self._demand
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter  # _wake() takes the slot on our behalf before resolving
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(background=background)  # woken and cancelled at once
            else:
                waiters.remove(waiter)
            raise

    def release(self, *, background: bool = False) -> None:
        self.in_use -= 1
        if background:
            self.background_in_use -= 1
        self._wake()

    def _may_take(self, background: bool) -> bool:
        if self.in_use >= self.capacity:
            return False
        if not background:
            return True
        return not self._demand and self.background_in_use < self.background_limit

    def _take(self, background: bool) -> None:
        self.in_use += 1
        if background:
            self.background_in_use += 1

    def _wake(self) -> None:
        while self._demand and self.in_use < self.capacity:
            self._hand_over(self._demand.popleft(), background=False)
        while self._background and self._may_take(True):
            self._hand_over(self._background.popleft(), background=True)

    def _hand_over(self, waiter: asyncio.Future[None], *, background: bool) -> None:
        if waiter.done():
            return
        self._take(background)
        waiter.set_result(None)
