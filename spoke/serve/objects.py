"""What answering ``GET``/``HEAD /objects/{path}`` takes, whichever server path answers.

The aiohttp handler (:mod:`spoke.serve.handlers`) and the fast path (:mod:`spoke.serve.fast`)
differ only in how bytes reach the socket; the decisions (status, headers, X-Cache,
plan and read-ahead bookkeeping, latency) are made here, once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from protocol.headers import CACHE_HEADER, PLAN_HEADER, STALE_HEADER
from protocol.manifest import Manifest
from protocol.media import content_type_for
from protocol.multipart import BoundaryInData, BoundaryWatch, new_boundary
from protocol.ranges import ByteRange
from protocol.response import Representation, ResponsePlan, plan_response
from service.metrics import Histogram
from spoke.cache.early import EarlyFetch, early_offset
from spoke.cache.engine import ChunkCache
from spoke.cache.keys import chunk_name, manifest_version
from spoke.prefetch.plans import PlanBook
from spoke.prefetch.readahead import SequentialReadahead
from spoke.serve.reader import RangeReader, Write

STALE_HEADERS = (
    # RFC 9111 §5.5 retired Warning, but caches and people still read it; the
    # second header is the machine-readable form.
    ("Warning", '110 hubspoke "Response is Stale"'),
    (STALE_HEADER, "hub-unreachable"),
)


def boundary_watch(plan: ResponsePlan) -> BoundaryWatch | None:
    """For a multipart answer streamed after its head: the check of its parts' bytes."""
    return None if plan.boundary is None else BoundaryWatch(plan.boundary)


def watched(watch: BoundaryWatch | None, write: Write) -> Write:
    """``write`` for the next part's data, refusing bytes that hold the answer's
    boundary: the head is gone, so the caller cuts the answer rather than send a
    body a client would split in the wrong places."""
    if watch is None:
        return write
    watch.next_part()

    async def checked(data: bytes | memoryview) -> None:
        if not watch.clean(data):
            raise BoundaryInData("a part's bytes hold the multipart boundary")
        await write(data)

    return checked


def representation(manifest: Manifest, path: str) -> Representation:
    """What the headers of an answer about ``manifest``'s version describe."""
    return Representation(manifest.size, manifest.etag, manifest.mtime_ns, content_type_for(path))


@dataclass(frozen=True, slots=True)
class Prime:
    """A chunk to resolve before an answer's head goes, and the range of the answer
    that reads it first (how much of it that range needs decides how long to wait)."""

    index: int
    within: ByteRange


@dataclass(frozen=True, slots=True)
class Prepared:
    """One read's answer, decided: the plan, its headers, and the chunks to resolve first."""

    plan: ResponsePlan
    x_cache: str
    headers: list[tuple[str, str]]  # the plan's, X-Cache, and the stale warning if any
    first_chunk: int | None  # resolved before the headers go, so a failure gets a status
    stale: bool
    # Resolved before the headers go, in order: the first chunk, and the first one not
    # local if that is another. An answer whose bytes the hub cannot bring (it is down,
    # the breaker is open) then gets a 503 with Retry-After, never a head promising
    # bytes that cannot come and then a cut connection.
    primes: tuple[Prime, ...] = ()

    @property
    def has_body(self) -> bool:
        return bool(self.plan.body) and self.plan.status != 304

    def with_plan(self, plan: ResponsePlan) -> Prepared:
        """This answer with ``plan``, its own plan reframed, in its place."""
        planned = dict(plan.headers)
        headers = [(name, planned.get(name, value)) for name, value in self.headers]
        return replace(self, plan=plan, headers=headers)


class ObjectReads:
    """The spoke's object reads: the cache and the bookkeeping every read feeds."""

    def __init__(
        self, cache: ChunkCache, plans: PlanBook, readahead: SequentialReadahead,
        readahead_chunks: int, latency: dict[str, Histogram],
    ) -> None:
        self.cache = cache
        self.plans = plans
        self.readahead = readahead
        self.readahead_chunks = readahead_chunks
        self.latency = latency

    def fetch_early(self, method: str, headers: Mapping[str, str], path: str) -> EarlyFetch | None:
        """For a read of an object not known yet, start the fetch of the chunk it starts
        in alongside its manifest's (:meth:`ChunkCache.fetch_early`, for reads
        :func:`spoke.cache.early.early_offset` allows); the caller drops it
        (:meth:`ChunkCache.drop_early`) when the read is over."""
        if self.cache.fresh_manifest(path) is not None:
            return None  # the usual case, settled by one lookup before any header is read
        return self.cache.fetch_early(path, early_offset(method, headers))

    def prepare(
        self, method: str, headers: Mapping[str, str], path: str, manifest: Manifest,
        stale: bool, tenant: str = "",
    ) -> Prepared:
        """Plan the answer to ``tenant``'s read of ``manifest``'s version; raises the
        plan's :class:`~protocol.errors.ProtocolError` (412, 416, 400)."""
        rep = representation(manifest, path)
        plan = plan_response(method, headers, rep, new_boundary, int(time.time()))
        x_cache, missing = self._locality(manifest, plan)
        plan_id = headers.get(PLAN_HEADER)
        ranges = plan.ranges
        if plan_id is not None:
            self.plans.observe(plan_id, tenant, path, [r.start for r in ranges])
        first_chunk = None
        primes: tuple[Prime, ...] = ()
        if method == "GET" and ranges and plan.status in (200, 206):
            self.readahead.observe(manifest, ranges)
            first_chunk = ranges[0].start // manifest.chunk_size
            primes = (Prime(first_chunk, ranges[0]),)
            if missing is not None and missing.index != first_chunk:
                primes += (missing,)
        out = list(plan.headers)
        if plan.status == 304:
            out = [(k, v) for k, v in out if k != "Content-Length"]
        out.append((CACHE_HEADER, x_cache))
        if stale:
            out += STALE_HEADERS
        return Prepared(plan, x_cache, out, first_chunk, stale, primes)

    def sending(self, prepared: Prepared) -> None:
        """The answer's head is going out (no error status can replace it now)."""
        if prepared.stale:
            self.cache.stats.stale_responses += 1

    def reader(self, manifest: Manifest, tenant: str) -> RangeReader:
        return RangeReader(self.cache, manifest, self.readahead_chunks, tenant)

    def observe_latency(self, x_cache: str, seconds: float) -> None:
        self.latency[x_cache.lower()].observe(seconds)

    def _locality(self, manifest: Manifest, plan: ResponsePlan) -> tuple[str, Prime | None]:
        """X-Cache, and the first chunk the response needs from the hub (None: none).

        HIT when every chunk the response touches is local (on disk, or verified in
        memory while it is stored), MISS when none is."""
        present = total = 0
        first_missing = None
        version, chunk_size = manifest_version(manifest), manifest.chunk_size
        for r in plan.ranges:
            for index in range(r.start // chunk_size, -(-r.stop // chunk_size)):
                total += 1
                if self.cache.is_local(chunk_name(version, index)):
                    present += 1
                elif first_missing is None:
                    first_missing = Prime(index, r)
        if present == total:
            return "HIT", None
        return "MISS" if present == 0 else "PARTIAL", first_missing
