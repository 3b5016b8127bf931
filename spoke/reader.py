"""Stream object ranges to a loader from the cache, chunk by chunk, in order.

Missing chunks ahead of the reader are fetched concurrently (a bounded window),
while bytes go out strictly in order and no more than one chunk per window slot
is held in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from protocol.chunks import ChunkSlice, chunk_slices
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache import Chunk, ChunkCache, ChunkGone

# Bounded so a 4 MiB slice of a cached chunk never sits in memory at once.
WRITE_BLOCK_BYTES = 1 << 20

Write = Callable[[bytes], Awaitable[None]]


class RangeReader:
    """Reads one object version's ranges through a :class:`ChunkCache`."""

    def __init__(
        self, cache: ChunkCache, manifest: Manifest, readahead: int, tenant: str = ""
    ) -> None:
        self.cache = cache
        self.manifest = manifest
        self.readahead = readahead
        self.tenant = tenant
        self._primed: dict[int, Chunk] = {}

    async def prime(self, index: int) -> None:
        """Resolve chunk ``index`` now, so a failure can still become an error status."""
        self._primed[index] = await self.cache.get(self.manifest, index, self.tenant)

    async def write(self, r: ByteRange, write: Write) -> None:
        slices = list(chunk_slices(r, self.manifest.size, self.manifest.chunk_size))
        ahead: dict[int, asyncio.Task[Chunk]] = {}
        try:
            for i, s in enumerate(slices):
                self._start_ahead(slices[i + 1 : i + 1 + self.readahead], ahead)
                chunk = await (ahead.pop(s.index) if s.index in ahead else self._chunk(s.index))
                await self._write_slice(chunk, s, write)
        finally:
            for task in ahead.values():
                task.cancel()  # the fetch itself is shielded and still gets cached

    def _start_ahead(
        self, upcoming: list[ChunkSlice], ahead: dict[int, asyncio.Task[Chunk]]
    ) -> None:
        for s in upcoming:
            if s.index in ahead or self.cache.is_cached(self.manifest, s.index):
                continue
            task = asyncio.ensure_future(self.cache.get(self.manifest, s.index, self.tenant))
            task.add_done_callback(_retrieve)
            ahead[s.index] = task

    async def _chunk(self, index: int) -> Chunk:
        primed = self._primed.pop(index, None)
        if primed is not None:
            return primed
        return await self.cache.get(self.manifest, index, self.tenant)

    async def _write_slice(self, chunk: Chunk, s: ChunkSlice, write: Write) -> None:
        offset = s.start
        while offset < s.stop:
            stop = min(s.stop, offset + WRITE_BLOCK_BYTES)
            try:
                data = await self.cache.read(chunk, offset, stop)
            except ChunkGone:
                # Evicted between lookup and read: fetch it again (same version).
                chunk = await self.cache.get(self.manifest, s.index, self.tenant)
                continue
            await write(data)
            if chunk.hit:
                self.cache.stats.bytes_served_hit += len(data)
            else:
                self.cache.stats.bytes_served_miss += len(data)
            offset = stop


def _retrieve(task: asyncio.Task[Chunk]) -> None:
    if not task.cancelled():
        task.exception()  # read-ahead failures surface when the reader gets there
