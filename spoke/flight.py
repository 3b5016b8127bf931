"""SingleFlight: one in-flight call per key; everyone else waits on its result.

After groupcache's ``singleflight``. The call runs in its own task, so a waiter
that goes away (a loader hanging up) cancels nothing the others wait on. The
key is released as soon as the call finishes, so a failure reaches every waiter
of that flight and the next caller starts afresh: no poisoned entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Task[V]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    async def do(self, key: K, call: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """Run ``call`` once per key at a time; returns (result, joined an existing flight)."""
        task = self._flights.get(key)
        joined = task is not None
        if task is None:
            task = asyncio.ensure_future(call())
            self._flights[key] = task
            task.add_done_callback(lambda t: self._release(key, t))
        return await asyncio.shield(task), joined

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the calls in flight, then cancel what remains."""
        tasks = list(self._flights.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def _release(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters may all have gone away
