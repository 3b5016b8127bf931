"""Stream object ranges to a loader from the cache, chunk by chunk, in order.

Missing chunks ahead of the reader are fetched concurrently (a bounded window),
while bytes go out strictly in order. A chunk on its way from the hub is sent
as its bytes arrive, not once it is whole: only the last
:data:`VERDICT_HOLD_BYTES` of each chunk's part wait for the chunk's digest
check, so an answer can never end normally with unverified bytes. If the
check fails, or the hub connection breaks, the write raises and the caller cuts
the connection: the loader sees a short body, never wrong bytes passed as whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from protocol.chunks import ChunkSlice, chunk_bounds, chunk_slices
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache.engine import Chunk, ChunkCache, ChunkGone
from spoke.cache.flight import Filling

# Bounded so a 4 MiB slice of a cached chunk never sits in memory at once.
WRITE_BLOCK_BYTES = 1 << 20
# The tail of each chunk's part that is sent only once the chunk is verified. A
# part no longer than this (a small sample, or a whole small chunk) goes out only
# verified, as a whole; and a chunk this small is resolved before the headers, so
# its failures still get an error status.
VERDICT_HOLD_BYTES = 64 << 10
# A reader following a fill wakes when this much more has arrived (or the part's
# end has), so it does not pay a wake-up per network read.
STREAM_STEP_BYTES = 256 << 10

Write = Callable[[bytes | memoryview], Awaitable[None]]


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

    async def prime(self, index: int, within: ByteRange | None = None) -> None:
        """Resolve chunk ``index`` now, so a failure can still become an error status.

        A cached chunk is looked up; a missing one is fetched until the hub has
        answered and its first bytes arrived. If the part of the chunk that
        ``within`` (the answer's range that reads it first, when given) needs is no
        longer than :data:`VERDICT_HOLD_BYTES`, until the chunk is verified: that part
        is sent only verified anyway, and a chunk failing its check then gets a
        status, not a cut connection. A chunk primed already is not waited for again.
        """
        if index in self._primed:
            return
        chunk = self.cache.stream(self.manifest, index, self.tenant)
        self._primed[index] = chunk
        fill = chunk.fill
        if fill is None:
            return
        part = fill.length
        if within is not None:
            bounds = chunk_bounds(index, self.manifest.size, self.manifest.chunk_size)
            part = min(within.stop, bounds.stop) - max(within.start, bounds.start)
            if part <= 0:  # not a range that reads this chunk
                part = fill.length
        if part <= VERDICT_HOLD_BYTES:
            await fill.wait_verified()
        else:
            await fill.wait(1)

    async def write(self, r: ByteRange, write: Write) -> None:
        slices = list(chunk_slices(r, self.manifest.size, self.manifest.chunk_size))
        chunks: dict[int, Chunk] = {}  # by position in ``slices``, started and not yet sent
        fetched: list[tuple[int, Filling]] = []  # (position, fill) this answer reads from
        for i, s in enumerate(slices):
            # Fetched fills are let go (their buffers can serve other fills once
            # stored); the cache bounds how many wait for the disk.
            fetched = [(pos, fill) for pos, fill in fetched if not fill.done]
            # The window starts at the oldest chunk still being fetched.
            base = min([i, *(pos for pos, _ in fetched)])
            for j in range(i, max(i + 1, base + 1 + self.readahead)):
                if j < len(slices) and j not in chunks and (
                    j == i or not self._cached(slices[j].index)
                ):
                    chunks[j] = self._chunk(slices[j].index)
                    fill = chunks[j].fill
                    if fill is not None:
                        fetched.append((j, fill))
            # An answer ends once its bytes are verified, not once they are on disk: a
            # chunk being stored is served from memory meanwhile (ChunkCache.stream).
            await self._write_slice(chunks.pop(i), s, write)
        # Fetches started ahead and not reached (the loader went away) still land
        # in the cache: the flights do not depend on this reader.

    def _cached(self, index: int) -> bool:
        return index not in self._primed and self.cache.is_cached(self.manifest, index)

    def _chunk(self, index: int) -> Chunk:
        primed = self._primed.pop(index, None)
        if primed is not None:
            return primed
        return self.cache.stream(self.manifest, index, self.tenant)

    async def _write_slice(self, chunk: Chunk, s: ChunkSlice, write: Write) -> None:
        """Send part ``s`` of ``chunk``."""
        if chunk.fill is not None:
            await self._write_filling(chunk.fill, s, write, chunk.hit)
            return
        offset = s.start
        while offset < s.stop:
            stop = min(s.stop, offset + WRITE_BLOCK_BYTES)
            try:
                data = await self.cache.read(chunk, offset, stop)
            except ChunkGone:
                # Evicted between lookup and read: fetch it again (same version).
                chunk = self.cache.stream(self.manifest, s.index, self.tenant)
                if chunk.fill is not None:
                    rest = ChunkSlice(s.index, offset, s.stop)
                    await self._write_filling(chunk.fill, rest, write, chunk.hit)
                    return
                continue
            await write(data)
            if chunk.hit:
                self.cache.stats.bytes_served_hit += len(data)
            else:
                self.cache.stats.bytes_served_miss += len(data)
            offset = stop

    async def _write_filling(self, fill: Filling, s: ChunkSlice, write: Write, hit: bool) -> None:
        """Send part ``s`` of a chunk being fetched, as its bytes arrive (``hit``: it
        is verified already, and being stored)."""
        offset = s.start
        held = max(s.start, s.stop - VERDICT_HOLD_BYTES)
        while offset < s.stop:
            if offset >= held:
                await fill.wait_verified()
                limit = s.stop
            else:
                await fill.wait(min(held, offset + STREAM_STEP_BYTES))
                limit = held
            view = fill.take(offset, min(limit, offset + WRITE_BLOCK_BYTES))
            if view is None:
                continue  # the attempt started over; wait for its bytes
            # No copy: the transport may keep the view past this fill (see BufferPool).
            await write(view)
            if hit:
                self.cache.stats.bytes_served_hit += len(view)
            else:
                self.cache.stats.bytes_served_miss += len(view)
            offset += len(view)
