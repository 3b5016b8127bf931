"""ChunkCache: the chunk store, the eviction policy, single-flight and the hub.

Rule 1: a chunk is resident only after its bytes passed verification and were
renamed into place, and its index row was written. Rule 2: bytes on disk never
exceed the capacity: a fill reserves its size first, evicting as needed, and the
victims' files are deleted before the new file is written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from cachetools import LRUCache

from protocol.chunks import chunk_bounds
from protocol.digests import digest
from protocol.manifest import Manifest, decode_manifest
from protocol.ranges import ByteRange
from service.background import ErrorCounts, run_every
from service.metrics import Histogram
from service.threads import background_pool
from spoke.cache.counters import SpokeStats
from spoke.cache.early import KEPT_S, Ahead
from spoke.cache.flight import BufferPool, Filling, SingleFlight
from spoke.cache.index import ChunkIndex, ChunkRow
from spoke.cache.integrity import ChunkChecker, Expected, identity_of, verify_stored
from spoke.cache.keys import ChunkKey, chunk_name, manifest_version
from spoke.cache.open_chunks import OpenChunks
from spoke.cache.resident import Resident, ResidentSet, covers
from spoke.cache.slots import Backlog, PrioritySlots, SlotClaim
from spoke.cache.store import BadChunkFile, ChunkStore
from spoke.cache.ttlmap import TTLMap
from spoke.policy.base import EvictionPolicy
from spoke.upstream.errors import (
    ChunkCorrupt,
    HubError,
    HubTimeout,
    HubUnavailable,
    ObjectNotFound,
    VersionChanged,
)
from spoke.upstream.hub import HeadCheck, HubClient
from spoke.upstream.resilience import (
    CLOSED,
    CircuitBreaker,
    RetryCounters,
    RetryPolicy,
    call_with_retries,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Hashing a chunk this large on the event loop would stall other requests; xxh3
# hashes a 4 MiB chunk in ~0.2 ms, less than the thread hop, so it stays inline.
_INLINE_DIGEST_BYTES = 256 << 10
_INLINE_DIGEST_BYTES_BY_ALG = {"xxh3-128": 64 << 20}
# Chunk buffers of finished fills kept to use again (see flight.BufferPool).
_POOLED_BUFFER_BYTES = 64 << 20
_ACCESS_FLUSH_INTERVAL_S = 5.0
_EXPIRY_INTERVAL_S = 5.0
# The cache's long-lived tasks, and the writes a refusing disk (full, read-only) may
# fail while the spoke serves on without them: each counted in /metrics by name.
BACKGROUND_TASKS = ("access-times", "expiry", "reader-pool", "scrub")
DISK_WRITES = ("chunk", "manifest", "removal")
# Reads up to this size of cached chunks are a pread on the event loop: chunks were
# written here recently, so the page cache usually holds them and a pread is a
# memcpy, cheaper than a thread hop (measured: 64 KiB warm reads ~1.6x, 4 MiB
# ~1.5x). Larger ones (the reader asks for at most 1 MiB) go to the thread pool.
INLINE_READ_BYTES = 1 << 20
# A known manifest past its TTL is served stale when the hub takes longer than this.
STALE_AFTER_S = 1.0
# A stopping spoke gives fills in flight this long to land before it lets them go.
_CLOSE_GRACE_S = 2.0
# A starting spoke waits this long for the hub to tell its chunk size (then asks on
# in the background), so that its first reads are fetched early too, and in the same
# way from one start to the next; a hub that is down delays the start no longer.
_SIZING_WAIT_S = 1.0
# From a LAN-speed hit of the hub's page cache up to a chunk crawling over a sick WAN.
FETCH_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk ready to read: its bytes in memory (just fetched) or its name on disk,
    or (``fill``, from :meth:`ChunkCache.stream`) on its way from the hub."""

    key: ChunkKey
    data: bytes | None
    hit: bool
    fill: Filling | None = None


class _Flight(NamedTuple):
    """A chunk flight: its key, its bytes as they arrive, its claim on a fetch slot."""

    key: ChunkKey
    fill: Filling
    claim: SlotClaim
    task: asyncio.Task[None]


class CacheWatcher(Protocol):
    """Told of every change to what the cache can answer from (see :mod:`spoke.workers.pool`)."""

    def manifest_fresh(self, path: str, manifest: Manifest, expires_at: float) -> None:
        """``manifest`` is ``path``'s until ``expires_at`` (``time.monotonic``)."""
        ...

    def manifest_gone(self, path: str) -> None: ...

    def chunk_added(self, name: str) -> None: ...

    def chunk_gone(self, name: str) -> None: ...


class ChunkGone(Exception):
    """A resident chunk's file vanished between lookup and read (evicted, purged)."""


class ChunkCache:
    def __init__(
        self,
        *,
        store: ChunkStore,
        index: ChunkIndex,
        policy: EvictionPolicy[Any],
        hub: HubClient,
        capacity_bytes: int,
        meta_ttl_s: float,
        fetch_concurrency: int,
        stats: SpokeStats | None = None,
        max_age_s: float = 0.0,
        tenant_quota_bytes: int = 0,
        pinned_prefixes: tuple[str, ...] = (),
        pin_fraction: float = 0.5,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.index = index
        self.policy = policy
        self.hub = hub
        self.capacity_bytes = capacity_bytes
        self.stats = stats or SpokeStats()
        self.max_age_s = max_age_s
        self.tenant_quota_bytes = tenant_quota_bytes
        # Chunks under these prefixes stay (out of the policy's reach) while they fit
        # in pin_fraction of the capacity: a dataset that must not be evicted.
        self.pinned_prefixes = pinned_prefixes
        self.pin_fraction = pin_fraction
        self._pinned: dict[str, int] = {}
        self._pinned_bytes = 0
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or CircuitBreaker()
        self.retry_counters = RetryCounters()
        self.retry_sleep = sleep  # the backoff between attempts (tests hold it)
        self.fetch_latency = Histogram(FETCH_LATENCY_BUCKETS_S)
        self._resident = ResidentSet()
        self._reserved_bytes = 0
        self._tenant_reserved: dict[str, int] = {}
        self._meta: TTLMap[str, Manifest] = TTLMap(maxsize=100_000, ttl_s=meta_ttl_s)
        # Last manifest seen per object, kept past the TTL for stale-if-error.
        self._known: LRUCache[str, Manifest] = LRUCache(maxsize=100_000)
        self._chunk_flights: SingleFlight[str, None] = SingleFlight()
        self._fills: dict[str, _Flight] = {}
        self._buffers = BufferPool(_POOLED_BUFFER_BYTES)
        self._jitter = random.Random()
        self._manifest_flights: SingleFlight[str, tuple[Manifest, bool]] = SingleFlight()
        self.watcher: CacheWatcher | None = None
        # Background fetches (pre-warm, read-ahead) get at most half the slots and
        # never one that a waiting loader could take.
        self._fetch_slots = PrioritySlots(fetch_concurrency, max(1, fetch_concurrency // 2))
        # Verified chunks on their way to disk, served from memory meanwhile; at most
        # as many as can be fetched at once, so a slow disk slows the fetches.
        self._storing = Backlog(fetch_concurrency)
        # Flights whose chunk was purged while it was being fetched: served, not stored.
        self._unwanted: set[str] = set()
        # Chunks fetched in the background and not read since: prefetch accuracy.
        self._prefetched: LRUCache[str, None] = LRUCache(maxsize=1_000_000)
        # SQLite connections belong to one thread; every index call goes through it.
        self._db = ThreadPoolExecutor(1, thread_name_prefix="spoke-index")
        # Storing runs at a lower CPU priority than fetching and serving (see
        # service.threads); as many threads as asyncio's default pool would give.
        self._writers = background_pool(min(32, (os.cpu_count() or 1) + 4), "spoke-store")
        self._accesses: dict[str, float] = {}
        # Chunk files are checked (and hashed once) before this process serves them.
        self.checker = ChunkChecker(self.store, self.expected, self.stats)
        self._fds = OpenChunks(self.checker)
        self._housekeeping: list[asyncio.Task[None]] = []
        self.background_errors = ErrorCounts("background task", BACKGROUND_TASKS, logger)
        # A refused write costs caching, never an answer: a warning, not an error.
        self.disk_errors = ErrorCounts("disk write of a", DISK_WRITES, logger,
                                       level=logging.WARNING)
        # Manifests the index refused (a full disk): saved again when next fetched.
        self._unsaved_manifests: set[str] = set()
        self._sizing: asyncio.Task[None] | None = None
        # First chunks asked for alongside their objects' manifests (spoke.cache.early), by
        # path; and the hub's chunk size, as its latest manifest had it.
        self._ahead: dict[str, Ahead] = {}
        self._hub_chunk_size: int | None = None

    # -- life cycle ---------------------------------------------------------

    async def open(self) -> float:
        """Load the persisted index and reconcile it with the files; returns seconds taken
        (not counting the wait for the hub's chunk size, at most :data:`_SIZING_WAIT_S`)."""
        started = time.perf_counter()
        rows, (on_disk, stray), temps = await self._in_db(self._scan)
        stale = [r.name for r in rows if r.name not in on_disk]
        present = [r for r in rows if r.name in on_disk]
        known = {r.name for r in rows}
        orphans = [name for name in on_disk if name not in known]
        keep, over = self._newest_within_capacity(present)
        stale += [r.name for r in over]  # the capacity was lowered since the last run
        for row in keep:  # least recently used first, so the policy order survives
            self._resident.add(row.name, Resident(row.size, row.path, row.tenant, row.stored_at,
                                                  row.digest_alg, row.digest))
            self._track(row.name, row.path, row.size)
        await self._write_index("removal", self._drop_files, stale + orphans, stale)
        await self._in_db(self._drop_stray, stray)
        self._housekeeping = [asyncio.create_task(run_every(
            "access-times", _ACCESS_FLUSH_INTERVAL_S, self._flush_accesses,
            self.background_errors,
        ))]
        if self.max_age_s:
            self._housekeeping.append(asyncio.create_task(run_every(
                "expiry", _EXPIRY_INTERVAL_S, self.expire, self.background_errors,
            )))
        self._sizing = asyncio.create_task(self._learn_hub_chunk_size())
        took = time.perf_counter() - started
        logger.info(
            "cache opened: %d chunks, %d bytes, %d dropped, %d orphans, %d temp files, %.3f s",
            len(self._resident), self._resident.used_bytes, len(stale), len(orphans), temps, took,
        )
        await asyncio.wait([self._sizing], timeout=_SIZING_WAIT_S)
        return took

    async def _learn_hub_chunk_size(self) -> None:
        """Ask the hub its chunk size once, at start, so that the first objects read
        have their first chunk fetched early too (:meth:`fetch_ahead`), not only those
        after the first manifest. Best effort: if the hub is down or does not say, the
        first manifest tells; a manifest that arrived first is newer and wins."""
        try:
            size = await self.hub.chunk_size()
        except HubError as exc:
            logger.info("the hub's chunk size is not known yet: %s", exc)
            return
        if self._hub_chunk_size is None:
            self._hub_chunk_size = size

    def _scan(self) -> tuple[list[ChunkRow], tuple[set[str], list[str]], int]:
        temps = self.store.remove_temp_files()
        return self.index.rows(), self.store.scan(), temps

    def _newest_within_capacity(
        self, rows: list[ChunkRow]
    ) -> tuple[list[ChunkRow], list[ChunkRow]]:
        """Split rows (oldest access first) into the most recent that fit, and the rest."""
        room = self.capacity_bytes
        cut = len(rows)
        while cut > 0 and rows[cut - 1].size <= room:
            room -= rows[cut - 1].size
            cut -= 1
        return rows[cut:], rows[:cut]

    def _drop_stray(self, paths: list[str]) -> None:
        for path in paths:
            self.store.delete_stray(path)

    def _drop_files(self, names: list[str], rows: list[str]) -> None:
        for name in names:
            self.store.delete(name)
        self.index.remove(rows)

    async def close(self) -> None:
        """Flush access times, let running fills finish briefly, leave no temp files."""
        for task in (*self._housekeeping, self._sizing):
            if task is not None:
                task.cancel()
        for ahead in list(self._ahead.values()):
            self.drop_ahead(ahead)  # guesses no read took on: not worth waiting for
        await self._chunk_flights.wait_idle(timeout_s=_CLOSE_GRACE_S)
        self._fds.close()
        try:
            await self._flush_accesses()
        except (OSError, sqlite3.Error) as exc:  # a full disk must not stop the stop
            self.background_errors.record("access-times", exc)
        await self._in_db(self.index.close)
        self._db.shutdown(wait=True)
        loop = asyncio.get_running_loop()
        # Writes still running finish before their temp files are swept.
        await loop.run_in_executor(None, self._writers.shutdown, True)
        await loop.run_in_executor(None, self.store.remove_temp_files)

    # -- metadata -----------------------------------------------------------

    async def manifest(self, path: str) -> tuple[Manifest, bool]:
        """The manifest of ``path`` and whether it is stale.

        Fresh: cached for the TTL, else asked of the hub. Stale: the hub could not
        be reached, and the last manifest seen (in memory or in the index) stands
        in, so cached chunks keep flowing during an outage (stale-if-error).
        """
        cached = self._meta.get(path)
        if cached is not None:
            return cached, False
        refresh = asyncio.ensure_future(
            self._manifest_flights.do(path, lambda: self._fetch_manifest(path))
        )
        known = self._known.get(path)
        if known is not None:
            # The TTL has passed but we know a version: a hub that is slow to answer
            # (not down, just silent) must not stall reads of chunks we hold.
            done, _ = await asyncio.wait({refresh}, timeout=STALE_AFTER_S)
            if not done:
                refresh.add_done_callback(_retrieve)
                self.stats.stale_manifests += 1
                return known, True
        manifest, stale = (await refresh)[0]
        self.stats.stale_manifests += stale
        return manifest, stale

    def refresh_ahead(self, path: str) -> None:
        """Revalidate ``path``'s manifest in the background once half its TTL is gone:
        reads answered elsewhere (reader workers) never reach :meth:`manifest`, and
        must not find it expired and wait on the hub."""
        if self._meta.time_left(path) < self._meta.ttl_s / 2:
            refresh = asyncio.ensure_future(
                self._manifest_flights.do(path, lambda: self._fetch_manifest(path))
            )
            refresh.add_done_callback(_retrieve)

    def invalidate(self, path: str) -> None:
        """Forget the cached metadata of ``path``; the next read asks the hub."""
        self._meta.pop(path, None)
        if self.watcher is not None:
            self.watcher.manifest_gone(path)

    async def _fetch_manifest(self, path: str) -> tuple[Manifest, bool]:
        async def attempt() -> tuple[Manifest, bytes]:
            self.stats.manifest_fetches += 1
            return await self.hub.fetch_manifest(path)

        try:
            manifest, body = await self._hub_call(attempt)
        except ObjectNotFound:
            # Deleted at the hub: stop serving it, and delete what we hold of it.
            self.invalidate(path)
            self._known.pop(path, None)
            await self._write_index("removal", self.index.delete_manifest, path)
            self.stats.purged_chunks += await self._remove(self._resident.matching(path, None))
            raise
        except (HubUnavailable, HubTimeout):
            stale = await self._last_known(path)
            if stale is None:
                raise
            return stale, True
        self._meta[path] = manifest
        self._hub_chunk_size = manifest.chunk_size
        ahead = self._ahead.get(path)
        if ahead is not None and ahead.bounds_in(manifest) is None:
            self.drop_ahead(ahead)  # another version or chunk size: of no use
        if self.watcher is not None:
            self.watcher.manifest_fresh(path, manifest, time.monotonic() + self._meta.ttl_s)
        if self._known.get(path) != manifest or path in self._unsaved_manifests:
            self._known[path] = manifest
            await self._save_manifest(path, body)
        return manifest, False

    async def _save_manifest(self, path: str, body: bytes) -> None:
        """Keep ``path``'s manifest for restarts and outages; a disk that refuses it
        costs only that (the read goes on), and the next fetch tries again."""
        saved = await self._write_index("manifest", self.index.save_manifest, path, body,
                                        time.time())
        if saved:
            self._unsaved_manifests.discard(path)
        else:
            self._unsaved_manifests.add(path)

    async def _last_known(self, path: str) -> Manifest | None:
        known = self._known.get(path)
        if known is not None:
            return known
        body = await self._in_db(self.index.load_manifest, path)
        return None if body is None else decode_manifest(body)

    # -- chunks -------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._resident.used_bytes

    @property
    def tenant_bytes(self) -> dict[str, int]:
        """Bytes cached per tenant (the tenant whose read brought each chunk in)."""
        return dict(self._resident.tenant_bytes)

    def tenant_bytes_under(self, covered: Callable[[str], bool]) -> dict[str, int]:
        """:attr:`tenant_bytes`, counting only the chunks of objects ``covered`` accepts."""
        return self._resident.tenant_bytes_under(covered)

    @property
    def hub_chunk_size(self) -> int | None:
        """The hub's chunk size, from its ``/healthz`` or its latest manifest."""
        return self._hub_chunk_size

    @property
    def fetches_in_flight(self) -> int:
        """Chunk fetches from the hub not yet verified (or failed)."""
        return sum(1 for flight in self._fills.values() if not flight.fill.done)

    @property
    def chunks_storing(self) -> int:
        """Verified chunks being written to disk (served from memory meanwhile)."""
        return self._storing.count

    @property
    def fill_buffer_bytes(self) -> int:
        """Chunk memory held by fills: fetches running, chunks verified and not yet
        stored; a miss still waiting for a fetch slot or a retry holds none."""
        return self._buffers.lent_bytes

    def is_cached(self, manifest: Manifest, index: int) -> bool:
        return chunk_name(manifest_version(manifest), index) in self._resident

    def manifest_time_left(self, path: str) -> float:
        """Seconds ``path``'s manifest stays fresh (0: not fresh)."""
        return self._meta.time_left(path)

    def fresh_manifest(self, path: str) -> Manifest | None:
        """The manifest of ``path`` when it is known and within its TTL; no I/O."""
        return self._meta.get(path)

    def is_resident(self, name: str) -> bool:
        """Whether chunk ``name`` (a :attr:`ChunkKey.name`) is on disk."""
        return name in self._resident

    def lookup(self, manifest: Manifest, index: int) -> Chunk | None:
        """Chunk ``index`` if it is on disk, counted as a loader's hit; else None, uncounted."""
        key = ChunkKey.of(manifest, index)
        if key.name not in self._resident:
            return None
        self._count_hit(key.name)
        return Chunk(key, None, True)

    def read_hit(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of resident chunk ``name``, counted as a loader's hit
        (the caller has checked :meth:`is_resident`); :meth:`read_now`'s errors."""
        self._count_hit(name)
        return self._pread(name, start, stop)

    def peek(self, name: str, start: int, stop: int) -> bytes:
        """:meth:`read_hit`'s bytes, not counted as a hit (a check made once per chunk)."""
        return self._pread(name, start, stop)

    def view_hit(self, name: str, start: int, stop: int) -> memoryview:
        """:meth:`read_hit`'s bytes as a view of the chunk's mapped file, no copy: only
        for a plain socket's transport (see :mod:`spoke.cache.open_chunks`). Raises ChunkGone (and
        forgets the chunk) when its file is gone or shorter than ``stop``."""
        return self._file_hit(name, self._fds.view, name, start, stop)

    def count_hits_elsewhere(self, hits: dict[str, int], served_bytes: int) -> None:
        """Hits a reader worker answered from this cache's files: counted, and
        seen by the policy as accesses, as if answered here."""
        for name, n in hits.items():
            if name in self._resident:
                self._count_hit(name)
                n -= 1
            self.stats.hits += n
        self.stats.bytes_served_hit += served_bytes

    def snapshot(self) -> tuple[list[tuple[str, Manifest, float]], list[str]]:
        """The fresh manifests (path, manifest, expiry) and the resident chunks' names."""
        return list(self._meta.live_items()), [name for name, _ in self._resident.items()]

    def fd_hit(self, name: str, need_bytes: int) -> int:
        """Resident chunk ``name``'s open descriptor, counted as a loader's hit; valid
        within the calling callback (see :meth:`OpenChunks.fd`). Raises ChunkGone (and
        forgets the chunk) when its file is gone or shorter than ``need_bytes``."""
        return self._file_hit(name, self._fds.fd, name, need_bytes)

    def _file_hit(self, name: str, get: Callable[..., T], *args: Any) -> T:
        """``get(*args)`` on resident chunk ``name``'s file, counted as a loader's hit;
        ChunkGone, the chunk forgotten, when ``get`` finds the file gone, torn or bad."""
        try:
            got = get(*args)
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        self._count_hit(name)
        return got

    def forget(self, name: str) -> None:
        """Chunk ``name``'s file turned out unusable: the next read fetches it again."""
        self._forget(name)

    def _unusable(self, name: str, exc: FileNotFoundError) -> ChunkGone:
        """Chunk ``name``'s file was found gone, torn (``exc``) or bad: forgotten, and a
        bad one dropped for good; the ChunkGone to raise (the read fetches it again)."""
        if isinstance(exc, BadChunkFile):
            self.drop_bad(name, exc.cause)
        else:
            self._forget(name)
        return ChunkGone(name)

    def expected(self, name: str) -> Expected | None:
        """What resident chunk ``name``'s file must hold; None if it is not resident."""
        resident = self._resident.get(name)
        if resident is None:
            return None
        return Expected(resident.size, resident.digest_alg, resident.digest)

    def expectations(self) -> list[tuple[str, Expected]]:
        """Every resident chunk's name and what its file must hold."""
        return [(name, Expected(r.size, r.digest_alg, r.digest))
                for name, r in self._resident.items()]

    def drop_bad(self, name: str, cause: str) -> None:
        """Chunk ``name``'s file is not its bytes (``cause``: see
        :data:`spoke.cache.store.CORRUPT_CAUSES`): if it is resident, counted, forgotten, its
        file deleted and its row removed. The next read fetches it again."""
        resident = self._resident.get(name)
        if resident is None:
            return  # dropped already (found by another read, or by a reader worker)
        self.stats.corrupt_chunks[cause] += 1
        logger.warning("chunk %s of %s is corrupt on disk (%s); dropping it", name,
                       resident.path, cause)
        self._forget(name)
        try:
            # Now, not queued: a fetch of it again must not have its new file deleted.
            self.store.delete(name)
        except OSError as exc:  # left for start-up's reconcile; never served again here
            self.disk_errors.record("removal", exc)
        # Queued before any new row of it can be (one thread, in order).
        removal = asyncio.get_running_loop().run_in_executor(self._db, self.index.remove, [name])
        removal.add_done_callback(self._removal_done)

    def _removal_done(self, removal: asyncio.Future[None]) -> None:
        error = None if removal.cancelled() else removal.exception()
        if error is not None:
            self.disk_errors.record("removal", error)

    async def recheck(self, name: str) -> None:
        """Hash resident chunk ``name``'s file again now (a reader worker found it bad):
        dropped if it is bad, else told to the readers again."""
        expected = self.expected(name)
        if expected is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, verify_stored, self.store, name, expected)
        except BadChunkFile as exc:
            if self.expected(name) == expected:
                self.drop_bad(name, exc.cause)
            return
        except FileNotFoundError:
            self._forget(name)
            return
        if self.watcher is not None and name in self._resident:
            self.watcher.chunk_added(name)  # a reader that let it go may serve it again

    def _count_hit(self, name: str) -> None:
        self._count_local_read(name)
        self.policy.touch(name)
        self._resident.touched(name)
        self._accesses[name] = time.time()

    def _count_local_read(self, name: str) -> None:
        """A loader's read of chunk ``name`` answered without the hub."""
        self.stats.hits += 1
        if name in self._prefetched:
            del self._prefetched[name]
            self.stats.prefetch_used += 1

    def open_fd(self, manifest: Manifest, index: int, need_bytes: int) -> int:
        """A new descriptor on cached chunk ``index``'s file, which the caller closes.

        Its own descriptor, so it stays valid across awaits (``sendfile`` waiting on a
        slow socket) even if the chunk is evicted meanwhile: chunk files are never
        rewritten in place, so the bytes stay the ones verified. Raises
        :class:`ChunkGone` when the file is gone or holds fewer than ``need_bytes``
        (torn), and forgets it, so the next read fetches it again.
        """
        name = ChunkKey.of(manifest, index).name
        try:
            return os.dup(self._fds.fd(name, need_bytes))
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None

    def read_now(self, chunk: Chunk, start: int, stop: int) -> bytes:
        """:meth:`read` without the event-loop hop, for small reads of cached chunks."""
        if chunk.data is not None:
            return chunk.data[start:stop]
        return self._pread(chunk.key.name, start, stop)

    def _pread(self, name: str, start: int, stop: int) -> bytes:
        try:
            data = self._fds.pread(name, start, stop)
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        if len(data) != stop - start:
            self._forget(name)
            raise ChunkGone(name)
        return data

    async def get(self, manifest: Manifest, index: int, tenant: str = "") -> Chunk:
        """Chunk ``index`` of ``manifest``'s version: from disk, or fetched once from the hub.

        ``tenant`` is whose read this is: a chunk it brings in counts against its quota.
        """
        hit = self._local(manifest, index)
        if hit is not None:
            return hit if hit.fill is None else Chunk(hit.key, hit.fill.data(), True)
        key = ChunkKey.of(manifest, index)
        self.stats.misses += 1
        fill, task, joined = self._flight(key, manifest, tenant, background=False)
        if joined:
            self.stats.singleflight_joins += 1
        await asyncio.shield(task)
        return Chunk(key, fill.data(), False)

    def stream(self, manifest: Manifest, index: int, tenant: str = "") -> Chunk:
        """Chunk ``index`` as :meth:`get` finds it, without waiting for a fetch.

        A hit is returned as by :meth:`get`; a miss starts (or joins) the hub fetch
        and comes back at once with its :class:`Filling`, which the caller follows
        as the bytes arrive. Counted as :meth:`get` counts.
        """
        hit = self._local(manifest, index)
        return hit if hit is not None else self._miss(manifest, index, tenant)

    def _local(self, manifest: Manifest, index: int) -> Chunk | None:
        """Chunk ``index`` answered without the hub, counted as a loader's hit: on disk,
        or (with its ``fill``) verified and in memory while it is being stored."""
        hit = self.lookup(manifest, index)
        if hit is not None:
            return hit
        key = ChunkKey.of(manifest, index)
        held = self._held(key.name)
        if held is None:
            return None
        self._count_local_read(key.name)
        return Chunk(key, None, True, held)

    def is_local(self, name: str) -> bool:
        """Whether chunk ``name`` can be answered without the hub: on disk, or
        verified in memory while it is being stored."""
        return name in self._resident or self._held(name) is not None

    def _held(self, name: str) -> Filling | None:
        """Chunk ``name``'s fill if it is verified and not yet stored."""
        flight = self._fills.get(name)
        return flight.fill if flight is not None and flight.fill.verified else None

    def _miss(self, manifest: Manifest, index: int, tenant: str) -> Chunk:
        key = ChunkKey.of(manifest, index)
        self.stats.misses += 1
        fill, _, joined = self._flight(key, manifest, tenant, background=False)
        if joined:
            # Counted on joining, so waiters of a flight that then fails count too.
            self.stats.singleflight_joins += 1
        return Chunk(key, None, False, fill)

    def _flight(
        self, key: ChunkKey, manifest: Manifest, tenant: str, background: bool
    ) -> tuple[Filling, asyncio.Task[None], bool]:
        """The flight of ``key``: joined if one runs (promoted if a loader now waits on it)."""
        running = self._fills.get(key.name)
        if running is not None:
            if not background:
                self._fetch_slots.promote(running.claim)
            return running.fill, running.task, True
        bounds = chunk_bounds(key.index, manifest.size, manifest.chunk_size)
        ahead = self._take_ahead(key.path, manifest, bounds)
        fill = Filling(bounds.length, self._buffers) if ahead is None else ahead.fill
        head_start = None if ahead is None else ahead.task
        claim = SlotClaim(background)
        task, _ = self._chunk_flights.begin(
            key.name, lambda: self._fill(key, manifest, tenant, fill, claim, head_start)
        )
        self._fills[key.name] = _Flight(key, fill, claim, task)
        task.add_done_callback(lambda _: self._fill_ended(key.name, fill))
        return fill, task, False

    def _fill_ended(self, name: str, fill: Filling) -> None:
        running = self._fills.get(name)
        if running is not None and running.fill is fill:
            del self._fills[name]
            self._unwanted.discard(name)
        # A reader still waiting (the flight was cancelled) must not wait forever.
        fill.fail(HubUnavailable("the chunk fetch was stopped"))

    def fetch_ahead(self, path: str, offset: int | None) -> Ahead | None:
        """Ask the hub for the chunk at ``offset`` of ``path`` now, while its manifest is
        being asked for (:mod:`spoke.cache.early`); the flight of that chunk takes it on.

        Only for an object the spoke holds nothing of (no manifest, no chunk: what it
        holds may make the fetch needless) once the hub's chunk size is known, while the
        hub answers (the circuit breaker is closed), and at most as many at once as
        there are fetch slots. The caller drops it
        (:meth:`drop_ahead`) when its read is over: one no flight took on is cancelled.
        One nobody drops is dropped :data:`spoke.cache.early.KEPT_S` after it ended.
        """
        chunk_size = self._hub_chunk_size
        if offset is None or chunk_size is None or path in self._ahead or \
                path in self._known or self._resident.holds_any_of(path) or \
                len(self._ahead) >= self._fetch_slots.capacity or \
                self.breaker.state != CLOSED:  # the hub is failing: no fetch on a guess
            return None
        start = offset - offset % chunk_size
        ahead = Ahead(path, ByteRange(start, start + chunk_size),
                      Filling(chunk_size, self._buffers))
        ahead.task = asyncio.create_task(self._run_ahead(ahead))
        ahead.task.add_done_callback(_retrieve)
        # The timer holds it weakly: one a flight took on is the flight's to keep, and
        # its chunk buffer must not outlive the flight by KEPT_S.
        kept = weakref.ref(ahead)
        ahead.task.add_done_callback(lambda _: asyncio.get_running_loop().call_later(
            KEPT_S, lambda: self.drop_ahead(kept())))
        self._ahead[path] = ahead
        self.stats.early_fetches += 1
        return ahead

    def drop_ahead(self, ahead: Ahead | None) -> None:
        if ahead is not None and self._ahead.get(ahead.path) is ahead:
            del self._ahead[ahead.path]
            if ahead.task is not None:
                ahead.task.cancel()

    async def _run_ahead(self, ahead: Ahead) -> None:
        async with self._fetch_slots.slot(claim=SlotClaim(False)):
            self.stats.hub_fetches += 1  # sent, as a flight's own fetch is counted
            await self._timed_fetch(ahead.path, None, ahead.asked, ahead.fill, ahead.on_head)
        self.stats.hub_bytes += ahead.fill.length

    def _take_ahead(self, path: str, manifest: Manifest, bounds: ByteRange) -> Ahead | None:
        """The fetch ahead that is exactly the chunk of ``manifest`` at ``bounds``,
        taken on by that chunk's flight."""
        ahead = self._ahead.get(path)
        if ahead is None or ahead.bounds_in(manifest) != bounds:
            return None
        del self._ahead[path]
        ahead.take_on(manifest, bounds)
        self.stats.early_fetches_used += 1
        return ahead

    def worth_prefetching(self, manifest: Manifest, index: int) -> bool:
        """Whether a prefetched chunk would be kept: room is free, or the policy would
        evict something for it (a plan-aware policy refuses chunks needed later than
        everything cached, and fetching those would only waste the link)."""
        size = chunk_bounds(index, manifest.size, manifest.chunk_size).length
        if self.used_bytes + self._reserved_bytes + size <= self.capacity_bytes:
            return True
        return self.policy.would_keep(ChunkKey.of(manifest, index).name)

    async def prefetch(self, manifest: Manifest, index: int, tenant: str = "") -> bool:
        """Make sure chunk ``index`` is cached, as background work; True if it was fetched.

        Not a loader lookup: hits and misses are not counted, and the hub fetch
        yields to demand fetches. ``tenant`` is whose job this is, as in :meth:`get`.
        """
        key = ChunkKey.of(manifest, index)
        if key.name in self._resident:
            return False
        _, task, joined = self._flight(key, manifest, tenant, background=True)
        if not joined:
            # Marked now: a loader may read it from memory while it is being stored.
            self._prefetched[key.name] = None
        try:
            await asyncio.shield(task)
        except BaseException:
            if not joined:
                self._prefetched.pop(key.name, None)
            raise
        if not joined:
            self.stats.prefetched_chunks += 1
        return not joined

    async def read(self, chunk: Chunk, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``chunk``; raises :class:`ChunkGone` if its file vanished."""
        if chunk.data is not None or stop - start <= INLINE_READ_BYTES:
            return self.read_now(chunk, start, stop)
        name = chunk.key.name
        try:
            # Checked here; read on a thread, from a descriptor of its own (the open
            # chunks' may be closed meanwhile).
            fd = os.dup(self._fds.fd(name, stop))
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, _pread_closing, fd, start, stop)
        if len(data) != stop - start:
            self._forget(chunk.key.name)
            raise ChunkGone(chunk.key.name)
        return data

    async def _fill(
        self, key: ChunkKey, manifest: Manifest, tenant: str, fill: Filling, claim: SlotClaim,
        head_start: asyncio.Task[None] | None = None,
    ) -> None:
        """Fetch the chunk into ``fill`` (``head_start``: a fetch ahead already bringing
        it), verify it, hand the verdict to its readers, then store it: readers never
        wait on the disk for their bytes."""
        name = key.name
        try:
            # Filled by a flight that ended after our lookup (with a head start, its
            # bytes are on their way into this fill already: they are used instead).
            if name in self._resident and head_start is None:
                with suppress(ChunkGone):  # bad or gone since: fetched after all
                    fill.feed(await self.read(Chunk(key, None, True), 0, fill.length))
                    fill.finish()
                    return
            # Fetch and verify before making room: a fill that fails (hub down) must not
            # have evicted anything, and a fetch waiting on the WAN holds no reservation.
            # (Found by the soak: outages used to cost cached chunks.)
            await self._fetch(key, manifest, fill, claim, head_start)
        except BaseException as exc:
            fill.fail(exc if isinstance(exc, Exception) else HubUnavailable("fetch stopped"))
            raise
        fill.finish()
        self._storing.enter()
        try:
            await self._store(key, manifest, tenant, fill)
        finally:
            self._storing.leave()

    async def _store(self, key: ChunkKey, manifest: Manifest, tenant: str, fill: Filling) -> None:
        """Make room for the verified chunk in ``fill`` and store it (or serve it uncached)."""
        if key.name in self._unwanted:  # purged while it was being fetched
            return
        victims, reserved = self._reserve(key.name, fill.length, tenant)
        try:
            if victims:
                await self._write_index("removal", self._drop_files, victims, victims)
            if reserved:
                await self._publish_or_skip(key, manifest, fill.view, tenant)
            else:
                self.stats.uncached_fills += 1
        finally:
            if reserved:
                self._release(tenant, fill.length)

    async def _fetch(
        self, key: ChunkKey, manifest: Manifest, fill: Filling, claim: SlotClaim,
        head_start: asyncio.Task[None] | None = None,
    ) -> None:
        """Fetch one chunk into ``fill`` and verify it, with retries; the first attempt
        is ``head_start``, a fetch ahead, when there is one.

        An attempt that fails starts over only while no reader has taken bytes of
        it; after that the failure is final (those readers' answers get cut).
        """
        bounds = chunk_bounds(key.index, manifest.size, manifest.chunk_size)

        async def bring() -> None:
            """This attempt's bytes into ``fill``: the head start's, else its own fetch."""
            nonlocal head_start
            if head_start is not None:
                ahead, head_start = head_start, None
                await ahead
                return
            await self._storing.room()
            async with self._fetch_slots.slot(claim=claim):
                self.stats.hub_fetches += 1
                await self._timed_fetch(key.path, key.etag, bounds, fill)
            self.stats.hub_bytes += bounds.length

        async def attempt() -> None:
            try:
                await bring()
                await self._verify(manifest, key.index, fill.view)
            except HubError as exc:
                # Taken back now, before the backoff: a reader joining during it must
                # wait for the next attempt's bytes, not be handed these.
                if not fill.discard_attempt():
                    exc.retryable = False  # readers have bytes of this attempt
                raise

        try:
            await self._hub_call(attempt)
        except VersionChanged:
            self.stats.fill_failures += 1
            self.invalidate(key.path)
            raise
        except Exception:
            self.stats.fill_failures += 1
            raise

    async def _timed_fetch(
        self, path: str, etag: str | None, r: ByteRange, fill: Filling,
        on_head: HeadCheck | None = None,
    ) -> None:
        """:meth:`HubClient.fetch_into`, its time observed whatever the outcome: a slow
        WAN must show in the fetch latency, failed attempts too."""
        started = time.perf_counter()
        try:
            await self.hub.fetch_into(path, etag, r, fill, on_head)
        finally:
            self.fetch_latency.observe(time.perf_counter() - started)

    async def _hub_call(self, call: Callable[[], Awaitable[T]]) -> T:
        return await call_with_retries(
            call, policy=self.retry, breaker=self.breaker, counters=self.retry_counters,
            sleep=self.retry_sleep,
            rng=self._jitter,  # one generator: a new one per call seeds from urandom
        )

    async def _verify(
        self, manifest: Manifest, index: int, data: bytes | bytearray | memoryview
    ) -> None:
        inline = _INLINE_DIGEST_BYTES_BY_ALG.get(manifest.digest_alg, _INLINE_DIGEST_BYTES)
        if len(data) > inline:
            loop = asyncio.get_running_loop()
            actual = await loop.run_in_executor(
                None, digest, manifest.digest_alg, memoryview(data)
            )
        else:
            actual = digest(manifest.digest_alg, memoryview(data))
        if actual != manifest.digests[index]:
            self.stats.verify_failures += 1
            raise ChunkCorrupt(
                f"chunk {index} of {manifest.path} failed {manifest.digest_alg} verification"
            )

    def _reserve(self, name: str, size: int, tenant: str) -> tuple[list[str], bool]:
        """Make room for ``size`` bytes; returns the victims and whether room was found.

        A tenant at its quota makes room among its own chunks first, so one job
        cannot evict everyone else's.
        """
        self.policy.admit(name)
        victims, within_quota = self._over_quota_victims(tenant, size)
        if not within_quota:
            return victims, False  # its own fills in flight already use its quota
        while self.used_bytes + self._reserved_bytes + size > self.capacity_bytes:
            victim = self.policy.evict(name)
            if victim is None:
                break
            if self._drop(victim) is not None:
                self.stats.evictions += 1
                victims.append(victim)
        if self.used_bytes + self._reserved_bytes + size > self.capacity_bytes:
            return victims, False  # everything left is being filled: serve, don't store
        self._reserved_bytes += size
        self._tenant_reserved[tenant] = self._tenant_reserved.get(tenant, 0) + size
        return victims, True

    def _release(self, tenant: str, size: int) -> None:
        self._reserved_bytes -= size
        left = self._tenant_reserved[tenant] - size
        if left:
            self._tenant_reserved[tenant] = left
        else:
            del self._tenant_reserved[tenant]

    def _over_quota_victims(self, tenant: str, size: int) -> tuple[list[str], bool]:
        """Evict ``tenant``'s own oldest chunks until ``size`` more fits its quota."""
        victims: list[str] = []
        if not self.tenant_quota_bytes:
            return victims, True
        reserved = self._tenant_reserved.get(tenant, 0)
        quota = self.tenant_quota_bytes
        while self._resident.tenant_bytes.get(tenant, 0) + reserved + size > quota:
            victim = self._resident.oldest_of(tenant)
            if victim is None:
                return victims, False
            self._drop(victim)
            self.policy.remove(victim)
            self.stats.quota_evictions += 1
            victims.append(victim)
        return victims, True

    def _drop(self, name: str) -> Resident | None:
        """Forget a chunk as resident (its file is deleted by the caller)."""
        self._fds.discard(name)
        self.checker.forget(name)
        self._pinned_bytes -= self._pinned.pop(name, 0)
        if self.watcher is not None:
            self.watcher.chunk_gone(name)
        return self._resident.remove(name)

    @property
    def chunk_count(self) -> int:
        """Chunks on disk (pinned ones included)."""
        return len(self._resident)

    @property
    def pinned_bytes(self) -> int:
        return self._pinned_bytes

    async def _publish_or_skip(
        self, key: ChunkKey, manifest: Manifest, data: bytes | bytearray | memoryview, tenant: str
    ) -> None:
        """Store the chunk; if the disk refuses (full, read-only), serve it uncached."""
        try:
            await self._publish(key, manifest, data, tenant)
        except (OSError, sqlite3.Error) as exc:
            self.disk_errors.record("chunk", exc)
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
        now = time.time()
        row = ChunkRow(key.name, key.path, key.etag, len(data), manifest.digest_alg,
                       manifest.digests[key.index], now, now, tenant)
        writing = loop.run_in_executor(self._writers, self.store.write, key.name, memoryview(data))
        indexed = loop.run_in_executor(self._db, self.index.add, row)
        written, row_error = await asyncio.gather(writing, indexed, return_exceptions=True)
        file_error = written if isinstance(written, BaseException) else None
        if file_error is not None or row_error is not None:
            if row_error is None:
                await self._write_index("removal", self.index.remove, [key.name])
            if file_error is None:
                await loop.run_in_executor(None, self.store.delete, key.name)
            error = file_error if file_error is not None else row_error
            assert isinstance(error, BaseException)
            raise error
        self._resident.add(key.name, Resident(len(data), key.path, tenant, now,
                                              manifest.digest_alg, manifest.digests[key.index]))
        if isinstance(written, os.stat_result):
            # These bytes were verified on their way in: the file needs no hash to be served.
            self.checker.remember(key.name, identity_of(written))
        self._track(key.name, key.path, len(data))
        if self.watcher is not None:
            self.watcher.chunk_added(key.name)

    def _track(self, name: str, path: str, size: int) -> None:
        """Hand a new resident chunk to the policy, unless it is pinned (never evicted)."""
        pinned = any(path.startswith(prefix) for prefix in self.pinned_prefixes)
        if pinned and self._pinned_bytes + size <= self.pin_fraction * self.capacity_bytes:
            self._pinned[name] = size
            self._pinned_bytes += size
        else:
            self.policy.insert(name, size)

    def _forget(self, name: str) -> None:
        if self._drop(name) is not None:
            self.policy.remove(name)
            self.stats.chunks_dropped += 1

    # -- purge --------------------------------------------------------------

    async def purge(self, path: str | None = None, prefix: str | None = None) -> int:
        """Remove every cached chunk (all versions) of ``path`` or under ``prefix``."""
        # Chunks already served but still being stored land first and go with the
        # rest; chunks still being fetched will not be stored (not waiting on the WAN).
        landing = []
        for name, flight in self._fills.items():
            if covers(path, prefix, flight.key.path):
                if flight.fill.verified:
                    landing.append(flight.task)
                else:
                    self._unwanted.add(name)
        if landing:
            await asyncio.wait(landing)
        removed = await self._remove(self._resident.matching(path, prefix))
        if path is not None:
            self.invalidate(path)
        self.stats.purged_chunks += removed
        return removed

    async def expire(self, now: float | None = None) -> int:
        """Remove chunks stored more than ``max_age_s`` ago (governance, not capacity)."""
        if not self.max_age_s:
            return 0
        deadline = (time.time() if now is None else now) - self.max_age_s
        removed = await self._remove(self._resident.stored_before(deadline))
        self.stats.expired_chunks += removed
        return removed

    async def _remove(self, names: list[str]) -> int:
        for name in names:
            self._drop(name)
            self.policy.remove(name)
        await self._write_index("removal", self._drop_files, names, names)
        return len(names)

    # -- plumbing -----------------------------------------------------------

    async def _in_db(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._db, call, *args)

    async def _write_index(self, kind: str, call: Callable[..., object], *args: Any) -> bool:
        """``call(*args)`` on the index thread; False, counted under ``kind``, if the
        disk refused it. For writes the spoke can go on without: a removal the index
        did not record leaves rows whose files are gone, which start-up drops."""
        try:
            await self._in_db(call, *args)
        except (OSError, sqlite3.Error) as exc:
            self.disk_errors.record(kind, exc)
            return False
        return True

    async def _flush_accesses(self) -> None:
        """Persist the access times read since the last flush (for the policy order
        after a restart); ones the index refused are kept for the next round."""
        if not self._accesses:
            return
        batch, self._accesses = self._accesses, {}
        try:
            await self._in_db(self.index.touch, batch)
        except BaseException:
            self._accesses = {**batch, **self._accesses}  # reads meanwhile are newer
            raise


def _pread_closing(fd: int, start: int, stop: int) -> bytes:
    try:
        return os.pread(fd, stop - start, start)
    finally:
        os.close(fd)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a background refresh's failure was answered with stale data
