"""TieredUpstream: the spoke's Upstream in a tier; a chunk comes from its owner, or the hub.

Manifests and listings come from the hub as ever (each spoke knows every version it
serves, from the hub itself). A chunk body this spoke does not own is asked of its owner
(:mod:`protocol.placement` over the live members) with the same request a hub is asked,
``GET /peer/objects/{path}`` with ``Range`` and ``If-Match``; the owner answers from its
cache or fetches the chunk from the hub once, under its own single-flight. So concurrent
misses across the tier cost one hub fetch.

A peer's bytes are received into a buffer of their own and checked against the manifest
digest here, before any of them reaches the chunk's fill: a peer that fails, stalls past
the peer timeout, or sends bytes that do not verify costs a fallback to the chunk's next
choice or to the hub, never a loader's read (the fill itself verifies again, as any).
Each failure counts against that peer's breaker (:mod:`spoke.tier.membership`).

A request a peer sent (:data:`SERVING_PEER` set in its handler's context, which the
chunk's flight inherits) always goes to the hub: an owner never asks on, so two spokes
that disagree about membership cannot send a chunk round in circles.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

from protocol.chunks import chunk_bounds
from protocol.digests import digest
from protocol.manifest import Manifest
from protocol.ranges import ByteRange, range_header
from spoke.cache.counters import SpokeStats
from spoke.tier.membership import Member, Membership
from spoke.upstream.base import BodyTarget, HeadCheck
from spoke.upstream.errors import (
    ChunkCorrupt,
    GoneAtHub,
    HubError,
    ObjectChanging,
    StaleVersion,
    UnavailableAnswer,
)
from spoke.upstream.hub import HubClient
from spoke.upstream.resilience import CircuitBreaker, CircuitOpen, is_connectivity_failure

logger = logging.getLogger(__name__)

# Set while a spoke answers a peer's chunk request: that chunk's fetch goes to the hub.
SERVING_PEER: contextvars.ContextVar[bool] = contextvars.ContextVar("serving_peer",
                                                                    default=False)
# Peers asked for one chunk before the hub is: its owner and its next choice.
MAX_PEER_TRIES = 2
# Peer bytes larger than this are hashed off the event loop (as fills hash theirs).
_INLINE_DIGEST_BYTES = 256 << 10
# Answers a peer's version mismatch or missing object with: the hub decides, not a peer.
_HUB_DECIDES = (StaleVersion, GoneAtHub, ObjectChanging, UnavailableAnswer)


@dataclass
class TierCounters:
    peer_fetches: int = 0  # chunks fetched from their owner (verified)
    peer_bytes: int = 0  # their bytes: the hub bytes the tier saved this spoke
    peer_errors: int = 0  # peer fetches that failed and fell back
    hub_direct: int = 0  # chunk fetches this spoke sent to the hub itself
    peers_asked_by: int = 0  # chunk requests other spokes sent this one
    peer_prefetches: int = 0  # chunks this spoke had their owner prefetch
    peer_prefetches_served: int = 0  # prefetches other spokes asked of this one
    peer_refused: int = 0  # peer requests refused for want of the tier's secret


class _Buffer:
    """A :class:`BodyTarget` of one peer answer, checked before it goes anywhere else."""

    def __init__(self, length: int) -> None:
        self.data = bytearray(length)
        self.view = memoryview(self.data)
        self.received = 0

    def space(self) -> memoryview:
        return self.view[self.received:]

    def advance(self, nbytes: int) -> None:
        self.received += nbytes


class TieredUpstream:
    def __init__(
        self, hub: HubClient, membership: Membership, *, secret: str, peer_timeout_s: float,
        max_connections: int, ssl_context: ssl.SSLContext | None = None,
        keep_copies: bool = False,
    ) -> None:
        self.hub = hub
        self.membership = membership
        self._secret = secret
        self._timeout_s = peer_timeout_s
        self._max_connections = max_connections
        self._ssl = ssl_context
        self.keep_copies = keep_copies
        self.counters = TierCounters()
        # The cache's counters (set once it is open): a fill counts each upstream fetch
        # as the hub's, and a chunk a peer brought is taken back off the hub's count here.
        self.stats: SpokeStats | None = None
        # The cache's breaker on the hub (set once it is open); see fetch_into.
        self.hub_breaker: CircuitBreaker | None = None
        self._clients: dict[str, HubClient] = {}
        self._session: aiohttp.ClientSession | None = None
        self._membership_task: asyncio.Task[None] | None = None
        # The last manifest seen of a path (the cache's, set once it is open).
        self.manifest_of: Callable[[str], Manifest | None] = lambda path: None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s,
                                        sock_read=self._timeout_s)
        self._session = aiohttp.ClientSession(
            timeout=timeout, headers={"Authorization": f"Bearer {self._secret}"},
            connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True))
        await self.membership.refresh()
        self._membership_task = asyncio.create_task(self.membership.run(self.probe))

    async def close(self) -> None:
        if self._membership_task is not None:
            self._membership_task.cancel()
            await asyncio.gather(self._membership_task, return_exceptions=True)
        for client in self._clients.values():
            await client.close()
        if self._session is not None:
            await self._session.close()
        await self.hub.close()

    # -- the Upstream protocol: all but chunk bodies are the hub's ------------

    @property
    def connections_opened(self) -> int:
        return self.hub.connections_opened

    async def fetch_manifest(self, path: str) -> tuple[Manifest, bytes]:
        return await self.hub.fetch_manifest(path)

    async def chunk_size(self) -> int | None:
        return await self.hub.chunk_size()

    async def list_objects(self, prefix: str) -> list[tuple[str, int]]:
        return await self.hub.list_objects(prefix)

    async def fetch_list(self, prefix: str, accept: str) -> tuple[bytes, str]:
        return await self.hub.fetch_list(prefix, accept)

    async def fetch_into(
        self, path: str, etag: str | None, r: ByteRange, target: BodyTarget,
        on_head: HeadCheck | None = None,
    ) -> None:
        """The chunk at ``r`` from its owner when that is another live spoke, else (or
        when the owner and the next choice both fail) from the hub."""
        manifest = self.manifest_of(path) if etag is not None else None
        if manifest is not None and manifest.etag == etag and not SERVING_PEER.get() \
                and r.start % manifest.chunk_size == 0:
            index = r.start // manifest.chunk_size
            ranked = self.membership.candidates(path, manifest.etag, index)
            for url in ranked[:MAX_PEER_TRIES]:
                member = self.membership.members.get(url)
                if member is None:
                    break  # this spoke is the best live choice: the hub it is
                if await self._from_peer(member, manifest, index, r, target):
                    return
        self.counters.hub_direct += 1
        breaker = self.hub_breaker
        if breaker is None or etag is None or not self._routed(path, etag, r):
            await self.hub.fetch_into(path, etag, r, target, on_head)  # the cache's breaker
            return
        # A chunk another spoke keeps: the cache's retries ran without the hub's breaker,
        # so its fallback to the hub goes through that breaker here.
        breaker.before_call()
        try:
            await self.hub.fetch_into(path, etag, r, target, on_head)
        except HubError as exc:
            if is_connectivity_failure(exc):
                breaker.on_failure()
            else:
                breaker.release_probe()
            raise
        except BaseException:
            breaker.release_probe()
            raise
        breaker.on_success()

    def _routed(self, path: str, etag: str, r: ByteRange) -> bool:
        """Whether the cache fetches this chunk as one another spoke keeps."""
        manifest = self.manifest_of(path)
        if manifest is None or manifest.etag != etag or r.start % manifest.chunk_size:
            return False
        return not self.keeps(path, etag, r.start // manifest.chunk_size)

    # -- placement, as the cache asks it ------------------------------------

    def keeps(self, path: str, etag: str, index: int) -> bool:
        """Whether this spoke stores a chunk it fetched: one it owns, one a peer asked it
        for (it is that chunk's owner as the peer sees the tier), or with keep_copies."""
        return self.keep_copies or SERVING_PEER.get() or \
            self.membership.owns(path, etag, index)

    async def prefetch_at_owner(self, manifest: Manifest, index: int) -> bool | None:
        """Ask the chunk's owner (or its next choice) to prefetch it: a warm job, a plan or
        a read-ahead on this spoke fills the spoke that keeps each chunk, and no byte of it
        comes here. True if the owner had to fetch it; None if no peer could be asked."""
        assert self._session is not None, "TieredUpstream.start() was not awaited"
        bounds = chunk_bounds(index, manifest.size, manifest.chunk_size)
        ranked = self.membership.candidates(manifest.path, manifest.etag, index)
        for url in ranked[:MAX_PEER_TRIES]:
            member = self.membership.members.get(url)
            if member is None:
                return None
            try:
                member.breaker.before_call()
            except CircuitOpen:
                continue
            headers = {"Range": range_header(bounds), "If-Match": manifest.etag}
            target = f"{url}/peer/prefetch/{quote(manifest.path, safe='/')}"
            try:
                async with self._session.post(target, headers=headers) as response:
                    answer = await response.read()
                    if response.status in (404, 409, 412):  # the hub decides, not a peer
                        member.breaker.release_probe()
                        return None
                    if response.status != 200:
                        raise ValueError(f"answered {response.status}")
                fetched = json.loads(answer)["fetched"]
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError,
                    TypeError) as exc:
                member.errors += 1
                self.counters.peer_errors += 1
                member.breaker.on_failure()
                logger.warning("peer %s failed to prefetch chunk %d of %s (%s)", url, index,
                               manifest.path, exc)
                continue
            member.breaker.on_success()
            self.counters.peer_prefetches += 1
            return bool(fetched)
        return None

    # -- peers ----------------------------------------------------------------

    async def _client(self, url: str) -> HubClient:
        client = self._clients.get(url)
        if client is None:
            # A peer answers chunk requests as a hub does, under /peer.
            client = HubClient(
                f"{url}/peer", connect_timeout_s=self._timeout_s,
                read_timeout_s=self._timeout_s, max_connections=self._max_connections,
                token=self._secret, ssl_context=self._ssl)
            await client.start()
            self._clients[url] = client
        return client

    async def _from_peer(
        self, member: Member, manifest: Manifest, index: int, r: ByteRange, target: BodyTarget,
    ) -> bool:
        """Whether ``member`` delivered the chunk, verified, into ``target``."""
        try:
            member.breaker.before_call()
        except CircuitOpen:
            return False
        buffer = _Buffer(r.length)
        try:
            client = await self._client(member.url)
            await client.fetch_into(manifest.path, manifest.etag, r, buffer)
            if buffer.received != r.length:
                raise ChunkCorrupt(f"peer {member.url} sent {buffer.received} of {r.length}")
            await self._verify(manifest, index, buffer.view)
        except _HUB_DECIDES as exc:
            # The peer answered: its idea of the version differs, or its own fetch from
            # the hub failed. Nothing against the peer; the hub decides.
            member.breaker.release_probe()
            logger.info("peer %s: %s; asking the hub", member.url, exc)
            return False
        except (HubError, OSError, ValueError) as exc:
            member.errors += 1
            self.counters.peer_errors += 1
            member.breaker.on_failure()
            logger.warning("peer %s failed chunk %d of %s (%s); next choice", member.url,
                           index, manifest.path, exc)
            return False
        member.breaker.on_success()
        target.space()[: r.length] = buffer.view
        target.advance(r.length)
        member.fetches += 1
        member.bytes += r.length
        self.counters.peer_fetches += 1
        self.counters.peer_bytes += r.length
        if self.stats is not None:
            self.stats.hub_fetches -= 1
            self.stats.hub_bytes -= r.length
        return True

    async def _verify(self, manifest: Manifest, index: int, data: memoryview) -> None:
        if len(data) > _INLINE_DIGEST_BYTES:
            actual = await asyncio.get_running_loop().run_in_executor(
                None, digest, manifest.digest_alg, data)
        else:
            actual = digest(manifest.digest_alg, data)
        if actual != manifest.digests[index]:
            raise ChunkCorrupt(f"chunk {index} of {manifest.path} from a peer failed "
                               f"{manifest.digest_alg} verification")

    async def probe(self, url: str) -> int | None:
        """``url``'s capacity as its ``/peer/info`` says; None if it does not answer."""
        assert self._session is not None, "TieredUpstream.start() was not awaited"
        try:
            async with self._session.get(f"{url}/peer/info") as response:
                if response.status != 200:
                    logger.warning("peer %s answered %d to its probe", url, response.status)
                    return None
                info = json.loads(await response.read())
            capacity = info["capacity_bytes"]
            return capacity if isinstance(capacity, int) and capacity > 0 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError):
            return None
