"""Fills: a missing chunk fetched once, verified, handed to its readers, then published.

Rule 1: a chunk is resident only after its bytes passed verification and were renamed
into place, and its index row was written. Each chunk has at most one flight (the
registry here is the only one); readers join it and follow its :class:`Filling` as
the bytes arrive. Fetch slots go to loaders before background work, and verified
chunks waiting for the disk are bounded, so a slow disk slows the fetches.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import suppress
from typing import NamedTuple

from protocol.chunks import chunk_bounds
from protocol.digests import digest
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from service.metrics import Histogram
from service.threads import background_pool
from spoke.cache.clock import Clock
from spoke.cache.counters import SpokeStats
from spoke.cache.early import EarlyFetch, EarlyFetches
from spoke.cache.flight import BufferPool, Filling
from spoke.cache.index import ChunkRow
from spoke.cache.integrity import identity_of
from spoke.cache.keys import ChunkKey
from spoke.cache.local import Chunk, ChunkGone, LocalChunks
from spoke.cache.manifests import Manifests
from spoke.cache.resident import Resident, covers
from spoke.cache.slots import Backlog, PrioritySlots, SlotClaim
from spoke.upstream.base import HeadCheck, Placement, Upstream
from spoke.upstream.errors import ChunkCorrupt, HubError, HubUnavailable, StaleVersion
from spoke.upstream.resilience import CLOSED, CircuitBreaker, ResilientCalls

# Hashing a chunk this large on the event loop would stall other requests; xxh3 hashes
# even large chunks faster than the thread hop would take, so it stays inline.
_INLINE_DIGEST_BYTES = 256 << 10
_INLINE_DIGEST_BYTES_BY_ALG = {"xxh3-128": 64 << 20}
# Digests cheap enough to take on the loop piece by piece as a chunk arrives
# (Filling.digesting): the verdict is ready with the last byte, and the loop never
# stops for a whole chunk's hash. Slower ones are taken at the end, in a thread.
_DIGESTED_ON_ARRIVAL = frozenset({"xxh3-128"})
# Chunk buffers of finished fills kept to use again (see flight.BufferPool).
_POOLED_BUFFER_BYTES = 64 << 20
# From a LAN-speed hit of the hub's page cache up to a chunk crawling over a sick WAN.
FETCH_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10)


class _Flight(NamedTuple):
    """A chunk flight: its key, its bytes as they arrive, its claim on a fetch slot."""

    key: ChunkKey
    fill: Filling
    claim: SlotClaim
    task: asyncio.Task[None]


class Fills:
    def __init__(
        self, upstream: Upstream, calls: ResilientCalls, local: LocalChunks,
        manifests: Manifests, stats: SpokeStats, clock: Clock, fetch_concurrency: int,
        placement: Placement | None = None, due: Callable[[str], float] | None = None,
    ) -> None:
        """``due``: when a chunk (by name) is needed, in a read plan's order (lower is
        sooner; ``-inf`` for none): waiting loader fetches go in that order."""
        self.upstream = upstream
        self._due = due
        self.placement = placement
        self.calls = calls
        # Chunks another spoke of the tier keeps are retried as any, but not behind the
        # hub's breaker: their owner may hold them while the hub is down (the tier's
        # upstream puts its own fallback to the hub behind that breaker).
        self._peer_calls = None if placement is None else ResilientCalls(
            calls.policy, CircuitBreaker(failure_threshold=1 << 62), clock=calls.clock,
            sleep=calls.sleep)
        self.local = local
        self.space = local.space
        self.db = local.db
        self.manifests = manifests
        self.stats = stats
        self._wall = clock.wall
        self.fetch_latency = Histogram(FETCH_LATENCY_BUCKETS_S)
        self.flights: dict[str, _Flight] = {}
        self.buffers = BufferPool(_POOLED_BUFFER_BYTES)
        # Background fetches (pre-warm, read-ahead) get at most half the slots and
        # never one that a waiting loader could take.
        self.slots = PrioritySlots(fetch_concurrency, max(1, fetch_concurrency // 2))
        # Verified chunks on their way to disk, served from memory meanwhile; at most
        # as many as can be fetched at once, so a slow disk slows the fetches.
        self.storing = Backlog(fetch_concurrency)
        # Flights whose chunk was purged while it was being fetched: served, not stored.
        self._unwanted: set[str] = set()
        # Storing runs at a lower CPU priority than fetching and serving (see
        # service.threads); as many threads as asyncio's default pool would give.
        self._writers = background_pool(min(32, (os.cpu_count() or 1) + 4), "spoke-store")
        # First chunks asked for alongside their objects' manifests (spoke.cache.early).
        self.early = EarlyFetches(self._run_early, self.buffers, stats)

    @property
    def fetching(self) -> int:
        """Chunk fetches from the upstream not yet verified (or failed)."""
        return sum(1 for flight in self.flights.values() if not flight.fill.done)

    def held(self, name: str) -> Filling | None:
        """Chunk ``name``'s fill if it is verified and not yet stored."""
        flight = self.flights.get(name)
        return flight.fill if flight is not None and flight.fill.verified else None

    def due(self, name: str) -> float:
        """When chunk ``name`` is needed, in plan order (``-inf``: no plan says, so now)."""
        return -math.inf if self._due is None else self._due(name)

    def flight(
        self, key: ChunkKey, manifest: Manifest, tenant: str, background: bool,
        borrows: bool = False,
    ) -> tuple[Filling, asyncio.Task[None], bool]:
        """The flight of ``key``: joined if one runs (promoted if a loader now waits on it);
        a new background one ``borrows`` idle demand slots (:mod:`spoke.cache.slots`)."""
        running = self.flights.get(key.name)
        if running is not None:
            if not background and running.claim.background:
                self.slots.promote(running.claim, self.due(key.name))
            return running.fill, running.task, True
        bounds = chunk_bounds(key.index, manifest.size, manifest.chunk_size)
        early = self.early.take(manifest, bounds)
        fill = Filling(bounds.length, self.buffers) if early is None else early.fill
        head_start = None if early is None else early.task
        # Plain background work is not ranked: it waits behind every loader anyway.
        rank = self.due(key.name) if borrows or not background else -math.inf
        claim = SlotClaim(background, rank, borrows=borrows)
        task = asyncio.ensure_future(self._fill(key, manifest, tenant, fill, claim, head_start))
        self.flights[key.name] = _Flight(key, fill, claim, task)
        task.add_done_callback(lambda done: self._ended(key.name, fill, done))
        return fill, task, False

    def _ended(self, name: str, fill: Filling, task: asyncio.Task[None]) -> None:
        running = self.flights.get(name)
        if running is not None and running.fill is fill:
            del self.flights[name]
            self._unwanted.discard(name)
        # A reader still waiting (the flight was cancelled) must not wait forever.
        fill.fail(HubUnavailable("the chunk fetch was stopped"))
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters may all have gone away

    def unwant(self, path: str | None, prefix: str | None) -> list[asyncio.Task[None]]:
        """Flights of the chunks a purge covers: those still being fetched will not be
        stored; returned, those already served and being stored (to wait for)."""
        landing = []
        for name, flight in self.flights.items():
            if covers(path, prefix, flight.key.path):
                if flight.fill.verified:
                    landing.append(flight.task)
                else:
                    self._unwanted.add(name)
        return landing

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the flights, then cancel what remains."""
        tasks = [flight.task for flight in self.flights.values()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        # Writes still running finish before their temp files are swept.
        await asyncio.get_running_loop().run_in_executor(None, self._writers.shutdown, True)

    def fetch_early(self, path: str, offset: int | None) -> EarlyFetch | None:
        """Ask the upstream for the chunk at ``offset`` of ``path`` now, while its
        manifest is being asked for (:mod:`spoke.cache.early`); the flight of that chunk
        takes it on.

        Only for an object the spoke holds nothing of (no manifest, no chunk: what it
        holds may make the fetch needless) once the chunk size is known, while the
        upstream answers (the circuit breaker is closed), and at most as many at once as
        there are fetch slots. The caller drops it (:meth:`EarlyFetches.drop`) when its
        read is over. One nobody drops is dropped :data:`spoke.cache.early.KEPT_S` after
        it ended.
        """
        chunk_size = self.manifests.chunk_size
        # In a tier the first chunk, too, goes through its owner, which needs its version.
        if self.placement is not None:
            return None
        if offset is None or chunk_size is None or path in self.early or \
                path in self.manifests or self.space.resident.holds_any_of(path) or \
                len(self.early) >= self.slots.capacity or \
                self.calls.breaker.state != CLOSED:  # the hub is failing: no fetch on a guess
            return None
        return self.early.start(path, offset, chunk_size)

    def worth_prefetching(self, manifest: Manifest, index: int) -> bool:
        """Whether a prefetched chunk would be kept: room is free, or the policy would
        evict something for it (a plan-aware policy refuses chunks needed later than
        everything cached, and fetching those would only waste the link)."""
        if self.space.fits(chunk_bounds(index, manifest.size, manifest.chunk_size).length):
            return True
        if self.placement is not None and \
                not self.placement.keeps(manifest.path, manifest.etag, index):
            return True  # another spoke of the tier keeps it: this one's room is no matter
        return self.space.policy.would_keep(ChunkKey.of(manifest, index).name)

    async def prefetch(
        self, manifest: Manifest, index: int, tenant: str = "", *, stored: bool = True,
        borrows: bool = False,
    ) -> bool:
        """Make sure chunk ``index`` is cached, as background work; True if it was fetched.

        Not a loader lookup: hits and misses are not counted, and the upstream fetch
        yields to demand fetches. ``tenant`` is whose job this is, as in
        :meth:`ChunkCache.get`. With ``stored=False`` it returns once the bytes are
        verified (readers are served from memory meanwhile), while the chunk is still
        being stored: a caller that bounds its fetches in flight then bounds fetches,
        not writes to a slow disk (those are bounded by the storing backlog). With
        ``borrows`` the fetch may take any slot no loader waits for, beyond the
        background share: for chunks a loader is about to read (a read plan's next).
        """
        key = ChunkKey.of(manifest, index)
        if key.name in self.space.resident:
            return False
        if self.placement is not None and key.name not in self.flights and \
                not self.placement.keeps(key.path, key.etag, index):
            # Another spoke of the tier keeps it: that spoke fetches it, and its bytes
            # need not come here (None: it could not be asked; fetched here after all).
            fetched = await self.placement.prefetch_at_owner(manifest, index)
            if fetched is not None:
                return fetched
        fill, task, joined = self.flight(key, manifest, tenant, background=True,
                                         borrows=borrows)
        prefetched = self.local.prefetched
        if not joined:
            # Marked now: a loader may read it from memory while it is being stored.
            prefetched[key.name] = None
        try:
            await (asyncio.shield(task) if stored else fill.wait_verified())
        except BaseException:
            if not joined:
                prefetched.pop(key.name, None)
            raise
        if not joined:
            self.stats.prefetched_chunks += 1
        return not joined

    async def _fill(
        self, key: ChunkKey, manifest: Manifest, tenant: str, fill: Filling, claim: SlotClaim,
        head_start: asyncio.Task[None] | None = None,
    ) -> None:
        """Fetch the chunk into ``fill`` (``head_start``: an early fetch already bringing
        it), verify it, hand the verdict to its readers, then store it: readers never
        wait on the disk for their bytes."""
        try:
            # Filled by a flight that ended after our lookup (with a head start, its
            # bytes are on their way into this fill already: they are used instead).
            if key.name in self.space.resident and head_start is None:
                with suppress(ChunkGone):  # bad or gone since: fetched after all
                    fill.feed(await self.local.read(Chunk(key, None, True), 0, fill.length))
                    fill.finish()
                    return
            # Fetch and verify before making room: a fill that fails (hub down) must not
            # have evicted anything, and a fetch waiting on the WAN holds no reservation.
            await self._fetch(key, manifest, fill, claim, head_start)
        except BaseException as exc:
            fill.fail(exc if isinstance(exc, Exception) else HubUnavailable("fetch stopped"))
            raise
        fill.finish()
        self.storing.enter()
        try:
            await self._store(key, manifest, tenant, fill)
        finally:
            self.storing.leave()

    async def _store(self, key: ChunkKey, manifest: Manifest, tenant: str, fill: Filling) -> None:
        """Make room for the verified chunk in ``fill`` and store it (or serve it uncached)."""
        if key.name in self._unwanted:  # purged while it was being fetched
            return
        if self.placement is not None and \
                not self.placement.keeps(key.path, key.etag, key.index):
            self.stats.uncached_fills += 1  # another spoke of the tier keeps it
            return
        victims, reserved = self.space.reserve(key.name, fill.length, tenant)
        try:
            if victims:
                await self.db.drop_files(victims, victims)
            if reserved:
                await self._publish_or_skip(key, manifest, fill.view, tenant)
            else:
                self.stats.uncached_fills += 1
        finally:
            if reserved:
                self.space.release(tenant, fill.length)

    async def _fetch(
        self, key: ChunkKey, manifest: Manifest, fill: Filling, claim: SlotClaim,
        head_start: asyncio.Task[None] | None = None,
    ) -> None:
        """Fetch one chunk into ``fill`` and verify it, with retries; the first attempt
        is ``head_start``, an early fetch, when there is one.

        An attempt that fails starts over only while no reader has taken bytes of
        it; after that the failure is final (those readers' answers get cut).
        """
        bounds = chunk_bounds(key.index, manifest.size, manifest.chunk_size)

        async def bring() -> None:
            """This attempt's bytes into ``fill``: the head start's, else its own fetch."""
            nonlocal head_start
            if head_start is not None:
                early, head_start = head_start, None
                await early
                return
            await self.storing.room()
            async with self.slots.slot(claim=claim):
                self.stats.hub_fetches += 1
                await self._timed_fetch(key.path, key.etag, bounds, fill)
            self.stats.hub_bytes += bounds.length

        async def attempt() -> None:
            try:
                if manifest.digest_alg in _DIGESTED_ON_ARRIVAL:
                    fill.digesting(manifest.digest_alg)
                await bring()
                await self._verify(manifest, key.index, fill)
            except HubError as exc:
                # Taken back now, before the backoff: a reader joining during it must
                # wait for the next attempt's bytes, not be handed these.
                if not fill.discard_attempt():
                    exc.retryable = False  # readers have bytes of this attempt
                raise

        try:
            calls = self.calls
            if self._peer_calls is not None and self.placement is not None and \
                    not self.placement.keeps(key.path, key.etag, key.index):
                calls = self._peer_calls
            await calls.call(attempt)
        except StaleVersion:
            self.stats.fill_failures += 1
            self.manifests.invalidate(key.path)
            raise
        except Exception:
            self.stats.fill_failures += 1
            raise

    async def _run_early(self, early: EarlyFetch) -> None:
        """An early fetch's bytes, in a loader's fetch slot."""
        async with self.slots.slot(claim=SlotClaim(False)):
            self.stats.hub_fetches += 1  # sent, as a flight's own fetch is counted
            await self._timed_fetch(early.path, None, early.asked, early.fill, early.on_head)
        self.stats.hub_bytes += early.fill.length

    async def _timed_fetch(
        self, path: str, etag: str | None, r: ByteRange, fill: Filling,
        on_head: HeadCheck | None = None,
    ) -> None:
        """:meth:`Upstream.fetch_into`, its time observed whatever the outcome: a slow
        WAN must show in the fetch latency, failed attempts too."""
        started = time.perf_counter()
        try:
            await self.upstream.fetch_into(path, etag, r, fill, on_head)
        finally:
            self.fetch_latency.observe(time.perf_counter() - started)

    async def _verify(self, manifest: Manifest, index: int, fill: Filling) -> None:
        alg = manifest.digest_alg
        actual = fill.digest(alg)  # taken as the bytes arrived, when it was
        if actual is None:
            data = memoryview(fill.view)
            if len(data) > _INLINE_DIGEST_BYTES_BY_ALG.get(alg, _INLINE_DIGEST_BYTES):
                actual = await asyncio.get_running_loop().run_in_executor(
                    None, digest, alg, data)
            else:
                actual = digest(alg, data)
        if actual != manifest.digests[index]:
            self.stats.verify_failures += 1
            raise ChunkCorrupt(
                f"chunk {index} of {manifest.path} failed {manifest.digest_alg} verification"
            )

    async def _publish_or_skip(
        self, key: ChunkKey, manifest: Manifest, data: bytes | bytearray | memoryview, tenant: str
    ) -> None:
        """Store the chunk; if the disk refuses (full, read-only), serve it uncached."""
        try:
            await self._publish(key, manifest, data, tenant)
        except (OSError, sqlite3.Error) as exc:
            self.db.disk_errors.record("chunk", exc)
            self.stats.uncached_fills += 1

    async def _publish(
        self, key: ChunkKey, manifest: Manifest, data: bytes | bytearray | memoryview, tenant: str
    ) -> None:
        """Write the file (temp, fsync, rename) and its index row, then make it resident.

        The two writes run side by side: a row whose file never landed (a crash, a
        full disk) is dropped when the cache opens, and a failed write takes its row
        back out here. Resident only once both are done.
        """
        loop = asyncio.get_running_loop()
        now = self._wall()
        store, index = self.db.store, self.db.index
        row = ChunkRow(key.name, key.path, key.etag, len(data), manifest.digest_alg,
                       manifest.digests[key.index], now, now, tenant)
        writing = loop.run_in_executor(self._writers, store.write, key.name, memoryview(data))
        indexed = self.db.add_row(row)
        written, row_error = await asyncio.gather(writing, indexed, return_exceptions=True)
        file_error = written if isinstance(written, BaseException) else None
        if file_error is not None or row_error is not None:
            if row_error is None:
                await self.db.write("removal", index.remove, [key.name])
            if file_error is None:
                await loop.run_in_executor(None, store.delete, key.name)
            error = file_error if file_error is not None else row_error
            assert isinstance(error, BaseException)
            raise error
        if isinstance(written, os.stat_result):
            # These bytes were verified on their way in: the file needs no hash to be served.
            self.local.checker.remember(key.name, identity_of(written))
        self.space.add(key.name, Resident(len(data), key.path, tenant, now,
                                          manifest.digest_alg, manifest.digests[key.index]))
        self.local.added(key.name)
