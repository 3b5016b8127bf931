"""Manifests: each object's manifest for its TTL, the last one known past it, and the
chunk size they have.

A manifest is asked of the upstream once per object at a time (single-flight), kept
fresh for ``ttl_s`` and saved to the index for restarts. Past its TTL the last one
known stands in while the upstream is down or slow to answer (stale-if-error), so
cached chunks keep flowing through an outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from cachetools import LRUCache

from protocol.manifest import Manifest, decode_manifest
from spoke.cache.clock import Clock
from spoke.cache.counters import SpokeStats
from spoke.cache.flight import SingleFlight
from spoke.cache.index_thread import IndexThread
from spoke.cache.ttlmap import TTLMap
from spoke.upstream.base import Upstream
from spoke.upstream.errors import GoneAtHub, HubError, HubTimeout, HubUnavailable
from spoke.upstream.resilience import ResilientCalls

logger = logging.getLogger(__name__)

# A known manifest past its TTL is served stale when the upstream takes longer than this.
STALE_AFTER_S = 1.0
MAX_MANIFESTS = 100_000


def _nothing(path: str) -> None:
    return None


async def _forget_nothing(path: str) -> None:
    return None


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a background refresh's failure was answered with stale data


class Manifests:
    def __init__(
        self,
        upstream: Upstream,
        calls: ResilientCalls,
        db: IndexThread,
        stats: SpokeStats,
        clock: Clock,
        ttl_s: float,
        *,
        on_fresh: Callable[[str, Manifest, float], None] = lambda path, manifest, until: None,
        on_gone: Callable[[str], None] = _nothing,
        on_deleted: Callable[[str], Awaitable[None]] = _forget_nothing,
    ) -> None:
        """``on_fresh(path, manifest, expires_at)``: a manifest came from the upstream;
        ``on_gone(path)``: one was forgotten; ``on_deleted(path)``: the upstream has
        no such object any more (its chunks are to go)."""
        self.upstream = upstream
        self.calls = calls
        self.db = db
        self.stats = stats
        self.clock = clock
        self.fresh_for: TTLMap[str, Manifest] = TTLMap(MAX_MANIFESTS, ttl_s, clock.monotonic)
        # Last manifest seen per object, kept past the TTL for stale-if-error.
        self._known: LRUCache[str, Manifest] = LRUCache(maxsize=MAX_MANIFESTS)
        self._flights: SingleFlight[str, tuple[Manifest, bool]] = SingleFlight()
        # Manifests the index refused (a full disk): saved again when next fetched.
        self._unsaved: set[str] = set()
        # The upstream's chunk size, as its latest manifest had it.
        self.chunk_size: int | None = None
        self._on_fresh, self._on_gone, self._on_deleted = on_fresh, on_gone, on_deleted
        # The hit path's one lookup, bound once.
        self.fresh = self.fresh_for.get
        self.time_left = self.fresh_for.time_left

    def __contains__(self, path: str) -> bool:
        """Whether any manifest of ``path`` is known (fresh or not)."""
        return path in self._known

    def known(self, path: str) -> Manifest | None:
        """The last manifest seen of ``path`` (fresh or not), without asking anyone."""
        return self._known.get(path)

    def live_items(self) -> Iterator[tuple[str, Manifest, float]]:
        """(path, manifest, expiry on the clock's ``monotonic``) of each fresh one."""
        return self.fresh_for.live_items()

    async def get(self, path: str) -> tuple[Manifest, bool]:
        """The manifest of ``path`` and whether it is stale.

        Fresh: cached for the TTL, else asked of the upstream. Stale: the upstream
        could not be reached, and the last manifest seen (in memory or in the index)
        stands in, so cached chunks keep flowing during an outage (stale-if-error).
        """
        cached = self.fresh_for.get(path)
        if cached is not None:
            return cached, False
        refresh = asyncio.ensure_future(self._flights.do(path, lambda: self._fetch(path)))
        known = self._known.get(path)
        if known is not None:
            # The TTL has passed but we know a version: an upstream slow to answer
            # (not down, just silent) must not stall reads of chunks we hold.
            done, _ = await asyncio.wait({refresh}, timeout=STALE_AFTER_S)
            if not done:
                refresh.add_done_callback(_retrieve)
                self.stats.stale_manifests += 1
                return known, True
        manifest, stale = (await refresh)[0]
        self.stats.stale_manifests += stale
        return manifest, stale

    def revalidate(self, path: str) -> None:
        """Ask for ``path``'s manifest again in the background once half its TTL is
        gone: reads answered elsewhere (reader workers) never reach :meth:`get`, and
        must not find it expired and wait on the upstream."""
        if self.fresh_for.time_left(path) < self.fresh_for.ttl_s / 2:
            refresh = asyncio.ensure_future(self._flights.do(path, lambda: self._fetch(path)))
            refresh.add_done_callback(_retrieve)

    def invalidate(self, path: str) -> None:
        """Forget the fresh manifest of ``path``; the next read asks the upstream."""
        self.fresh_for.pop(path, None)
        self._on_gone(path)

    async def learn_chunk_size(self) -> None:
        """Ask the upstream its chunk size once, at start, so that the first objects
        read have their first chunk fetched early too, not only those after the first
        manifest. Best effort: if the upstream is down or does not say, the first
        manifest tells; a manifest that arrived first is newer and wins."""
        try:
            size = await self.upstream.chunk_size()
        except HubError as exc:
            logger.info("the hub's chunk size is not known yet: %s", exc)
            return
        if self.chunk_size is None:
            self.chunk_size = size

    async def _fetch(self, path: str) -> tuple[Manifest, bool]:
        async def attempt() -> tuple[Manifest, bytes]:
            self.stats.manifest_fetches += 1
            return await self.upstream.fetch_manifest(path)

        try:
            manifest, body = await self.calls.call(attempt)
        except GoneAtHub:
            # Deleted upstream: stop serving it, and delete what we hold of it.
            self.invalidate(path)
            self._known.pop(path, None)
            await self.db.write("removal", self.db.index.delete_manifest, path)
            await self._on_deleted(path)
            raise
        except (HubUnavailable, HubTimeout):
            stale = await self._last_known(path)
            if stale is None:
                raise
            return stale, True
        self.fresh_for[path] = manifest
        self.chunk_size = manifest.chunk_size
        self._on_fresh(path, manifest, self.clock.monotonic() + self.fresh_for.ttl_s)
        if self._known.get(path) != manifest or path in self._unsaved:
            self._known[path] = manifest
            await self._save(path, body)
        return manifest, False

    async def _save(self, path: str, body: bytes) -> None:
        """Keep ``path``'s manifest for restarts and outages; a disk that refuses it
        costs only that (the read goes on), and the next fetch tries again."""
        saved = await self.db.write("manifest", self.db.index.save_manifest, path, body,
                                    self.clock.wall())
        if saved:
            self._unsaved.discard(path)
        else:
            self._unsaved.add(path)

    async def _last_known(self, path: str) -> Manifest | None:
        known = self._known.get(path)
        if known is not None:
            return known
        body = await self.db.run(self.db.index.load_manifest, path)
        return None if body is None else decode_manifest(body)
