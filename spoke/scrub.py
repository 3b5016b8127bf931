"""Scrub: re-hash every cached chunk against the digest recorded at fill time.

Finds bit rot and tampering on the spoke's disk; bad chunks are deleted so the
next read fetches them again. Two forms, one check (:func:`spoke.integrity.verify_stored`):

- :func:`scrub`, blocking, for ``python -m spoke verify`` and for start-up
  (``--verify-on-start``), before the cache is opened for serving;
- :class:`BackgroundScrub`, while serving (``--scrub-rate``): resident chunks in
  turn, at most that many bytes a second, on a thread of its own at a lower CPU
  priority. Reads check a chunk file only when its identity (inode, size, mtime)
  changed; this finds the changes that keep it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.threads import background_pool
from spoke.index import ChunkIndex
from spoke.integrity import Expected, verify_stored
from spoke.store import BadChunkFile, ChunkStore

if TYPE_CHECKING:
    from spoke.cache import ChunkCache

logger = logging.getLogger(__name__)

# A pass over a cache of a few small chunks would otherwise start again at once.
PASS_PAUSE_S = 1.0
# After an error, wait this long before the next chunk (no busy loop on a sick disk).
ERROR_PAUSE_S = 1.0
ERROR_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class ScrubReport:
    checked: int
    bad: int
    missing: int


def scrub(store: ChunkStore, index: ChunkIndex) -> ScrubReport:
    """Check every indexed chunk; delete and unindex the bad and the missing."""
    checked = bad = missing = 0
    dropped: list[str] = []
    for row in index.rows():
        try:
            verify_stored(store, row.name, Expected(row.size, row.digest_alg, row.digest))
        except BadChunkFile as exc:
            checked += 1
            logger.warning("chunk %s of %s is corrupt on disk (%s); dropping it",
                           row.name, row.path, exc.cause)
            bad += 1
            store.delete(row.name)
            dropped.append(row.name)
            continue
        except FileNotFoundError:
            missing += 1
            dropped.append(row.name)
            continue
        checked += 1
    index.remove(dropped)
    return ScrubReport(checked, bad, missing)


class BackgroundScrub:
    """Re-hashes the resident chunks of ``cache``, ``rate_bytes_s`` at most, forever.

    Bad chunks are dropped through the cache (:meth:`ChunkCache.drop_bad`), and
    counted there with the bytes checked. An error is counted, logged at most once
    a minute, and the scrub goes on with the next chunk.
    """

    def __init__(self, cache: ChunkCache, rate_bytes_s: int) -> None:
        self.cache = cache
        self.rate_bytes_s = rate_bytes_s
        self._thread = background_pool(1, "spoke-scrub")
        self._logged_at = float("-inf")

    async def run_forever(self) -> None:
        try:
            while True:
                try:
                    chunks = self.cache.expectations()
                except Exception as exc:  # the scrub outlives its errors, whatever they are
                    await self._failed("listing the chunks", exc)
                    chunks = []
                for name, expected in chunks:
                    await self._step(name, expected)
                await asyncio.sleep(PASS_PAUSE_S)
        finally:
            self._thread.shutdown(wait=False, cancel_futures=True)

    async def _step(self, name: str, expected: Expected) -> None:
        """Check one chunk (if it is still resident as it was), then wait its share."""
        try:
            if self.cache.expected(name) != expected:
                return  # dropped since the pass began
            await self._check(name, expected)
        except Exception as exc:
            await self._failed(f"checking chunk {name}", exc)
            return
        await asyncio.sleep(expected.size / self.rate_bytes_s)

    async def _failed(self, doing: str, exc: Exception) -> None:
        """Count an error, log it (at most once a minute), and pause."""
        self.cache.stats.scrub_errors += 1
        now = time.monotonic()
        if now - self._logged_at >= ERROR_LOG_INTERVAL_S:
            self._logged_at = now
            logger.warning("background scrub: %s failed: %r (%d errors so far)", doing, exc,
                           self.cache.stats.scrub_errors)
        await asyncio.sleep(ERROR_PAUSE_S)

    async def _check(self, name: str, expected: Expected) -> None:
        stats = self.cache.stats
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._thread, verify_stored, self.cache.store, name,
                                       expected)
        except BadChunkFile as exc:
            if self.cache.expected(name) == expected:  # not dropped while it was hashed
                self.cache.drop_bad(name, exc.cause)
        except FileNotFoundError:
            if self.cache.expected(name) == expected:
                self.cache.forget(name)  # gone from under the cache: fetched when read
        stats.scrubbed_chunks += 1
        stats.scrubbed_bytes += expected.size
