"""Scrub: re-hash every cached chunk against the digest recorded at fill time.

Finds bit rot and tampering on the spoke's disk; bad chunks are deleted so the
next read fetches them again. Two forms, one check (:func:`spoke.cache.integrity.verify_stored`):

- :func:`scrub`, blocking, for ``python -m spoke verify`` and for start-up
  (``--verify-on-start``), before the cache is opened for serving;
- :class:`BackgroundScrub`, while serving (``--scrub-rate``): resident chunks in
  turn, at most that many bytes a second, on a thread of its own at a lower CPU
  priority. Reads check a chunk file only when its identity (inode, size, mtime)
  changed; this finds the changes that keep it.

Salvage is their kin for a damaged index (:class:`spoke.cache.index.ChunkIndex` set it
aside): the rows still readable in the old file go into the new one when the
chunk file they name passes the same check. A chunk file's name alone does not
say which object, version or digest it holds, so a chunk with no readable row
cannot be kept; opening the cache then deletes it as an orphan.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.threads import background_pool
from spoke.cache.index import ChunkIndex, ChunkRow, salvageable_rows
from spoke.cache.integrity import Expected, verify_stored
from spoke.cache.store import BadChunkFile, ChunkStore

if TYPE_CHECKING:
    from spoke.cache.engine import ChunkCache

logger = logging.getLogger(__name__)

# A pass over a cache of a few small chunks would otherwise start again at once.
PASS_PAUSE_S = 1.0
# After an error, wait this long before the next chunk (no busy loop on a sick disk).
ERROR_PAUSE_S = 1.0


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


@dataclass(frozen=True, slots=True)
class SalvageReport:
    kept: int  # rows read back whose chunk file bore them out
    refused: int  # rows read back whose file was missing or did not match


def open_index(store: ChunkStore, cache_dir: str) -> ChunkIndex:
    """The cache's index; a damaged one set aside and salvaged into a new one."""
    index = ChunkIndex(cache_dir)
    if index.set_aside is not None:
        report = salvage(store, index, index.set_aside)
        logger.warning(
            "salvaged %d chunks from the damaged index (%d rows not borne out by their "
            "files); chunk files it no longer names are deleted", report.kept, report.refused,
        )
    return index


def salvage(store: ChunkStore, index: ChunkIndex, damaged_path: str) -> SalvageReport:
    """Refill ``index`` (new, empty) from the damaged index at ``damaged_path``."""
    kept: list[ChunkRow] = []
    refused = 0
    for row in salvageable_rows(damaged_path):
        if _intact(store, row):
            kept.append(row)
        else:
            refused += 1
    index.add_many(kept)
    return SalvageReport(len(kept), refused)


def _intact(store: ChunkStore, row: ChunkRow) -> bool | None:
    """Whether ``row``'s chunk file passes the scrub's check; None if there is none."""
    try:
        verify_stored(store, row.name, Expected(row.size, row.digest_alg, row.digest))
    except FileNotFoundError:
        return None
    except (BadChunkFile, ValueError):  # ValueError: an unknown algorithm, a torn row
        return False
    return True


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
        """Count an error (logged at most once a minute, as every background task's),
        and pause."""
        self.cache.stats.scrub_errors += 1
        self.cache.background_errors.record("scrub", RuntimeError(f"{doing}: {exc!r}"))
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
