"""Loader-ordered prefetch: the chunks a plan needs next, fetched ahead of its readers.

For each plan in the book (:mod:`spoke.prefetch.plans`) one background task keeps a
window of bytes ahead of the plan's cursor cached, as background work that yields to
demand fetches, and leaves alone chunks the cache would not keep yet (needed later
than everything cached).

The book comes first, because the cache's policy consults it; the prefetcher is made
after the cache and given it, so each object is whole once it is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from protocol.errors import ProtocolError
from protocol.manifest import Manifest
from spoke.cache.engine import ChunkCache
from spoke.prefetch.plans import PlanBook, PlannedRead, ReadPlan

logger = logging.getLogger(__name__)


class PlanPrefetcher:
    """Makes and drops the plans of one spoke, and runs their prefetches."""

    def __init__(
        self, book: PlanBook, cache: ChunkCache, window_bytes: int, concurrency: int = 4
    ) -> None:
        self.book = book
        self.cache = cache
        self.window_bytes = window_bytes
        self.concurrency = concurrency
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def create(
        self, reads: Iterable[PlannedRead], tenant: str = "", *, plan_id: str | None = None,
        job: str = "",
    ) -> ReadPlan:
        """Book ``tenant``'s plan of ``reads`` and start prefetching for it; with
        ``plan_id``, a plan already booked under it is returned instead; plans of one
        ``job`` follow one another (:meth:`PlanBook.add`)."""
        reads = list(reads)
        paths = list(dict.fromkeys(read.path for read in reads))
        # All at once: over a WAN, one round trip per shard in turn held up the job's
        # first reads by as many round trips as it has shards.
        got = await asyncio.gather(*(self.cache.manifest(path) for path in paths))
        manifests: dict[str, Manifest] = {path: m[0] for path, m in zip(paths, got, strict=True)}
        moved = asyncio.Event()
        plan = self.book.add(reads, manifests, tenant, on_move=moved.set, plan_id=plan_id,
                             job=job)
        if plan.id not in self._tasks:  # a job's other rank may have booked it meanwhile
            self._tasks[plan.id] = asyncio.create_task(self._prefetch(plan, moved))
        return plan

    async def delete(self, plan_id: str, tenant: str = "") -> None:
        self.book.get(plan_id, tenant)
        await self._remove(plan_id)

    async def _remove(self, plan_id: str) -> None:
        self.book.remove(plan_id)
        task = self._tasks.pop(plan_id)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for plan_id in list(self._tasks):
            await self._remove(plan_id)

    async def _prefetch(self, plan: ReadPlan, moved: asyncio.Event) -> None:
        """Keep the window of chunks ahead of the plan's cursor cached."""
        in_flight: dict[asyncio.Future[object], str] = {}
        # Chunks tried while in the window are not tried again until they leave it:
        # one the policy declined to keep would otherwise be fetched in a loop.
        attempted: set[str] = set()
        try:
            while not plan.finished:
                moved.clear()
                # The chunks of reads that came too, if not at hand: an answer asks for
                # its chunks in turn (the cache's policy may have evicted some of them
                # already where the plan does not fit: not fetched again for those).
                upcoming = plan.upcoming(self._window_chunks(plan), self._wanted(plan))
                attempted &= set(upcoming)
                for name in upcoming:
                    if len(in_flight) >= self.concurrency:
                        break
                    if name in attempted or self.cache.is_cached(*plan.where[name]):
                        continue
                    if not self.cache.worth_prefetching(*plan.where[name]):
                        break  # needed later than all that is cached: no point yet
                    attempted.add(name)
                    in_flight[asyncio.ensure_future(self._fetch(plan, name))] = name
                woken: asyncio.Future[object] = asyncio.ensure_future(moved.wait())
                done, _ = await asyncio.wait({*in_flight, woken},
                                             return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                for task in done:
                    in_flight.pop(task, None)
        finally:
            for task in in_flight:
                task.cancel()

    def _window_chunks(self, plan: ReadPlan) -> int:
        """Chunks to keep ahead: the window, but when the plan's data does not fit in
        half the cache, no more than an eighth of it, or prefetched chunks would push
        out the ones about to be read."""
        if not plan.where:
            return 1
        capacity = self.cache.capacity_bytes
        window = min(self.window_bytes, capacity if self._fits(plan) else capacity // 8)
        return max(1, window // self._chunk_size(plan))

    def _wanted(self, plan: ReadPlan) -> Callable[[str], bool] | None:
        """Which chunks of reads that came are worth a look: those neither at hand nor
        being fetched, when the plan fits (else one that is not may have been evicted
        as done with)."""
        if not self._fits(plan):
            return None
        underway = self.cache.is_underway
        return lambda name: not underway(name)

    def _fits(self, plan: ReadPlan) -> bool:
        """Whether the plan's data fits in half the cache."""
        return bool(plan.where) and \
            plan.distinct_chunks * self._chunk_size(plan) <= self.cache.capacity_bytes // 2

    @staticmethod
    def _chunk_size(plan: ReadPlan) -> int:
        return next(iter(plan.where.values()))[0].chunk_size

    async def _fetch(self, plan: ReadPlan, name: str) -> None:
        manifest, index = plan.where[name]
        try:
            # Done once verified: counted until stored, the fetches in flight stalled
            # on every write to a slow disk while the link sat idle. Borrowing idle
            # slots: these are the chunks the plan's loaders read next.
            await self.cache.prefetch(manifest, index, plan.tenant, stored=False,
                                      borrows=True)
        except ProtocolError as exc:
            logger.info("plan %s: prefetch of %s chunk %d failed: %s", plan.id,
                        manifest.path, index, exc)
