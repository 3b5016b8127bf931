"""A retry backoff a test holds open (``ChunkCache.retry_sleep``), so that what must
happen during it (a reader joining the flight) happens there every time."""

from __future__ import annotations

import asyncio


class HeldBackoff:
    """The retry's backoff, held until the test lets it end."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.pauses = 0

    async def sleep(self, seconds: float) -> None:
        self.pauses += 1
        self.entered.set()
        await self.release.wait()
