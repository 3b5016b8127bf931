"""ChunkCache: the spoke's cache engine, a facade over the units that do its jobs.

Rule 1: a chunk is resident only after its bytes passed verification and were
renamed into place, and its index row was written (:mod:`spoke.cache.fills`). Rule 2:
bytes on disk never exceed the capacity: a fill reserves its size first, evicting as
needed, and the victims' files are deleted before the new file is written
(:mod:`spoke.cache.space`). Manifests are :mod:`spoke.cache.manifests`'; reads of
chunks on disk are :mod:`spoke.cache.local`'. It takes an :class:`Upstream` and a
:class:`Clock`, and reads nothing else of the world.

The methods the hit paths call are the units' own, bound here once: going through
the facade costs them no call.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from protocol.manifest import Manifest
from service.background import ErrorCounts, run_every
from spoke.cache.clock import Clock
from spoke.cache.counters import SpokeStats
from spoke.cache.fills import Fills
from spoke.cache.index import ChunkIndex
from spoke.cache.index_thread import IndexThread
from spoke.cache.keys import ChunkKey
from spoke.cache.local import CacheWatcher, Chunk, ChunkGone, LocalChunks
from spoke.cache.manifests import Manifests
from spoke.cache.space import Space
from spoke.cache.store import ChunkStore
from spoke.policy.base import EvictionPolicy
from spoke.upstream.base import Placement, Upstream
from spoke.upstream.resilience import CircuitBreaker, ResilientCalls, RetryPolicy

__all__ = ["CacheWatcher", "Chunk", "ChunkCache", "ChunkGone"]

logger = logging.getLogger(__name__)

_ACCESS_FLUSH_INTERVAL_S = 5.0
_EXPIRY_INTERVAL_S = 5.0
# The cache's long-lived tasks, and the writes a refusing disk (full, read-only) may
# fail while the spoke serves on without them: each counted in /metrics by name.
BACKGROUND_TASKS = ("access-times", "expiry", "reader-pool", "scrub")
DISK_WRITES = ("chunk", "manifest", "removal")
# A stopping spoke gives fills in flight this long to land before it lets them go.
_CLOSE_GRACE_S = 2.0
# A starting spoke waits this long for the hub to tell its chunk size (then asks on
# in the background), so that its first reads are fetched early too, and in the same
# way from one start to the next; a hub that is down delays the start no longer.
_SIZING_WAIT_S = 1.0


class ChunkCache:
    def __init__(
        self, *, store: ChunkStore, index: ChunkIndex, policy: EvictionPolicy[Any],
        hub: Upstream, clock: Clock, capacity_bytes: int, meta_ttl_s: float,
        fetch_concurrency: int, stats: SpokeStats | None = None, max_age_s: float = 0.0,
        tenant_quota_bytes: int = 0, pinned_prefixes: tuple[str, ...] = (),
        pin_fraction: float = 0.5, retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        placement: Placement | None = None, due: Callable[[str], float] | None = None,
    ) -> None:
        self.store, self.index, self.policy, self.hub = store, index, policy, hub
        self.capacity_bytes = capacity_bytes
        self.stats = stats or SpokeStats()
        self.max_age_s = max_age_s
        self._clock = clock
        self.breaker = breaker or CircuitBreaker(clock=clock.monotonic)
        calls = ResilientCalls(retry or RetryPolicy(), self.breaker, clock=clock.monotonic,
                               sleep=sleep)
        self.calls, self.retry_counters = calls, calls.counters  # tests hold calls.sleep
        self.background_errors = ErrorCounts("background task", BACKGROUND_TASKS, logger)
        # A refused write costs caching, never an answer: a warning, not an error.
        self.disk_errors = ErrorCounts("disk write of a", DISK_WRITES, logger,
                                       level=logging.WARNING)
        self.db = IndexThread(store, index, self.disk_errors)
        self.space = Space(policy, capacity_bytes, self.stats,
                           tenant_quota_bytes=tenant_quota_bytes,
                           pinned_prefixes=pinned_prefixes, pin_fraction=pin_fraction)
        self._resident = self.space.resident
        self.local = local = LocalChunks(self.space, self.db, self.stats, clock)
        self.manifests = manifests = Manifests(
            hub, calls, self.db, self.stats, clock, meta_ttl_s,
            on_fresh=self._manifest_fresh, on_gone=self._manifest_gone,
            on_deleted=self._deleted_at_hub)
        self.fills = fills = Fills(hub, calls, local, manifests, self.stats, clock,
                                   fetch_concurrency, placement, due)
        self.early = fills.early
        self.fetch_latency = fills.fetch_latency
        self._housekeeping: list[asyncio.Task[None]] = []
        self._sizing: asyncio.Task[None] | None = None
        # The units' own methods, bound once (see the module's docstring).
        self.manifest, self.fresh_manifest = manifests.get, manifests.fresh
        self.manifest_time_left, self.revalidate = manifests.time_left, manifests.revalidate
        self.invalidate = manifests.invalidate
        self.is_cached, self.is_resident, self.lookup = (
            local.is_cached, local.is_resident, local.lookup)
        self.read_hit, self.peek, self.view_hit = local.read_hit, local.peek, local.view_hit
        self.fd_hit, self.open_fd, self.forget = local.fd_hit, local.open_fd, local.forget
        self.read, self.read_now = local.read, local.read_now
        self.count_hits_elsewhere = local.count_hits_elsewhere
        self.expected, self.expectations = local.expected, local.expectations
        self.drop_bad, self.recheck = local.drop_bad, local.recheck
        self._held, self._count_local_read = fills.held, local.count_local_read
        self.fetch_early, self.drop_early = fills.fetch_early, fills.early.drop
        self.prefetch, self.worth_prefetching = fills.prefetch, fills.worth_prefetching

    # -- life cycle ---------------------------------------------------------

    async def open(self) -> float:
        """Load the persisted index and reconcile it with the files; returns seconds taken
        (not counting the wait for the hub's chunk size, at most :data:`_SIZING_WAIT_S`)."""
        started = time.perf_counter()
        dropped, orphans, temps = await self.db.reconcile(self.space)
        self._housekeeping = [asyncio.create_task(run_every(
            "access-times", _ACCESS_FLUSH_INTERVAL_S, self.local.flush_accesses,
            self.background_errors,
        ))]
        if self.max_age_s:
            self._housekeeping.append(asyncio.create_task(run_every(
                "expiry", _EXPIRY_INTERVAL_S, self.expire, self.background_errors,
            )))
        self._sizing = asyncio.create_task(self.manifests.learn_chunk_size())
        took = time.perf_counter() - started
        logger.info(
            "cache opened: %d chunks, %d bytes, %d dropped, %d orphans, %d temp files, %.3f s",
            len(self._resident), self._resident.used_bytes, dropped, orphans, temps, took,
        )
        await asyncio.wait([self._sizing], timeout=_SIZING_WAIT_S)
        return took

    async def close(self) -> None:
        """Flush access times, let running fills finish briefly, leave no temp files."""
        for task in (*self._housekeeping, self._sizing):
            if task is not None:
                task.cancel()
        self.early.drop_all()  # guesses no read took on: not worth waiting for
        await self.fills.wait_idle(timeout_s=_CLOSE_GRACE_S)
        self.local.fds.close()
        try:
            await self.local.flush_accesses()
        except (OSError, sqlite3.Error) as exc:  # a full disk must not stop the stop
            self.background_errors.record("access-times", exc)
        await self.db.close()
        await self.fills.close()
        await asyncio.get_running_loop().run_in_executor(None, self.store.remove_temp_files)

    # -- what the units tell -----------------------------------------------

    @property
    def watcher(self) -> CacheWatcher | None:
        return self.local.watcher

    @watcher.setter
    def watcher(self, watcher: CacheWatcher | None) -> None:
        self.local.watcher = watcher

    def _manifest_fresh(self, path: str, manifest: Manifest, expires_at: float) -> None:
        self.early.drop_unusable(manifest)  # another version or chunk size: of no use
        if self.local.watcher is not None:
            self.local.watcher.manifest_fresh(path, manifest, expires_at)

    def _manifest_gone(self, path: str) -> None:
        if self.local.watcher is not None:
            self.local.watcher.manifest_gone(path)

    async def _deleted_at_hub(self, path: str) -> None:
        self.stats.purged_chunks += await self._remove(self._resident.matching(path, None))

    # -- figures ------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._resident.used_bytes

    @property
    def chunk_count(self) -> int:
        """Chunks on disk (pinned ones included)."""
        return len(self._resident)

    @property
    def pinned_bytes(self) -> int:
        return self.space.pinned_bytes

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
        return self.manifests.chunk_size

    @property
    def fetches_in_flight(self) -> int:
        """Chunk fetches from the hub not yet verified (or failed)."""
        return self.fills.fetching

    @property
    def chunks_storing(self) -> int:
        """Verified chunks being written to disk (served from memory meanwhile)."""
        return self.fills.storing.count

    @property
    def fill_buffer_bytes(self) -> int:
        """Chunk memory held by fills: fetches running, chunks verified and not yet
        stored; a miss still waiting for a fetch slot or a retry holds none."""
        return self.fills.buffers.lent_bytes

    def snapshot(self) -> tuple[list[tuple[str, Manifest, float]], list[str]]:
        """The fresh manifests (path, manifest, expiry) and the resident chunks' names."""
        return list(self.manifests.live_items()), [name for name, _ in self._resident.items()]

    # -- chunks -------------------------------------------------------------

    async def get(self, manifest: Manifest, index: int, tenant: str = "") -> Chunk:
        """Chunk ``index`` of ``manifest``'s version: from disk, or fetched once from the hub.

        ``tenant`` is whose read this is: a chunk it brings in counts against its quota.
        """
        hit = self._local(manifest, index)
        if hit is not None:
            return hit if hit.fill is None else Chunk(hit.key, hit.fill.data(), True)
        key = ChunkKey.of(manifest, index)
        self.stats.misses += 1
        fill, task, joined = self.fills.flight(key, manifest, tenant, background=False)
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

    def is_underway(self, name: str) -> bool:
        """Whether chunk ``name`` needs no fetch started: on disk, or its flight runs."""
        return name in self._resident or name in self.fills.flights

    def _miss(self, manifest: Manifest, index: int, tenant: str) -> Chunk:
        key = ChunkKey.of(manifest, index)
        self.stats.misses += 1
        fill, _, joined = self.fills.flight(key, manifest, tenant, background=False)
        if joined:
            # Counted on joining, so waiters of a flight that then fails count too.
            self.stats.singleflight_joins += 1
        return Chunk(key, None, False, fill)

    # -- purge --------------------------------------------------------------

    async def purge(self, path: str | None = None, prefix: str | None = None) -> int:
        """Remove every cached chunk (all versions) of ``path`` or under ``prefix``."""
        # Chunks already served but still being stored land first and go with the
        # rest; chunks still being fetched will not be stored (not waiting on the WAN).
        landing = self.fills.unwant(path, prefix)
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
        deadline = (self._clock.wall() if now is None else now) - self.max_age_s
        removed = await self._remove(self._resident.stored_before(deadline))
        self.stats.expired_chunks += removed
        return removed

    async def _remove(self, names: list[str]) -> int:
        for name in names:
            self.space.remove(name)
        await self.db.drop_files(names, names)
        return len(names)
