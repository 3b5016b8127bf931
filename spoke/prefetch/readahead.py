"""Read-ahead for sequential readers: fetch the chunks after a stream's position.

A loader streaming a shard asks for one range after another. A read that starts
where the previous read of that object ended continues a stream; after two such
reads in a row (a shuffled reader lands on the next sample by chance now and
then, twice in a row almost never) the spoke keeps the next ``window`` chunks in
flight as background work, so
the stream pays the WAN round trip once, not once per chunk. The window should
cover bandwidth × RTT (1 GB/s × 60 ms ≈ 15 chunks of 4 MiB).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from protocol.errors import ProtocolError
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache.engine import ChunkCache

logger = logging.getLogger(__name__)

# Objects whose last read end is remembered: enough for every loader worker's
# current shard, bounded whatever the number of objects read.
_MAX_STREAMS = 4096
# Reads in a row that continue the previous one before the spoke reads ahead.
_STREAK = 2


class SequentialReadahead:
    def __init__(self, cache: ChunkCache, window_chunks: int) -> None:
        self.cache = cache
        self.window_chunks = window_chunks
        # Per object version: where its last read ended, and how many reads in a row
        # continued the one before.
        self._ends: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._tasks: dict[tuple[str, str, int], asyncio.Task[None]] = {}

    def observe(self, manifest: Manifest, ranges: list[ByteRange]) -> None:
        """A read of ``ranges`` arrived; if it continues a stream, fetch ahead of it."""
        if not ranges or self.window_chunks <= 0:
            return
        key = (manifest.path, manifest.etag)
        previous_end, streak = self._ends.pop(key, (-1, 0))
        streak = streak + 1 if ranges[0].start == previous_end else 0
        self._ends[key] = (ranges[-1].stop, streak)
        if len(self._ends) > _MAX_STREAMS:
            self._ends.popitem(last=False)
        if streak >= _STREAK:
            self._fetch_after(manifest, ranges[-1].stop)

    def _fetch_after(self, manifest: Manifest, offset: int) -> None:
        first = -(-offset // manifest.chunk_size)  # the chunk after the one being read
        last = min(manifest.chunk_count, first + self.window_chunks)
        for index in range(first, last):
            name = (manifest.path, manifest.etag, index)
            if name in self._tasks or self.cache.is_cached(manifest, index):
                continue
            self._tasks[name] = asyncio.create_task(self._fetch(manifest, index, name))

    async def _fetch(self, manifest: Manifest, index: int, name: tuple[str, str, int]) -> None:
        try:
            await self.cache.prefetch(manifest, index)
        except ProtocolError as exc:  # the reader will ask again, and see the error then
            logger.debug("read-ahead of %s chunk %d failed: %s", manifest.path, index, exc)
        finally:
            self._tasks.pop(name, None)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
