"""The spoke's fast path: loaders' ``GET``/``HEAD /objects/{path}`` without aiohttp.

A cache hit of a small range is answered synchronously, within the event-loop
callback that read the request: the manifest from memory, the bytes by ``pread``
on a chunk descriptor already open, head and body in one ``writev``. Large cached
ranges go out with ``os.sendfile``; misses wait on the cache as under aiohttp.
Anything else (other routes, an unusual request, a token that does not check out,
a client at its in-flight limit) is declined, and aiohttp answers it as it always
did. Decisions (status, headers, X-Cache, bookkeeping) are :mod:`spoke.serve.objects`'s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from protocol.auth import authorize
from protocol.chunks import chunk_slices
from protocol.errors import ProtocolError
from protocol.http1 import RequestHead
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from service.auth import GUARD
from service.fast import FastConnection, Reply
from service.limits import LIMIT
from service.problem import PROBLEM_JSON, error_headers, problem_body
from spoke.cache.engine import ChunkGone
from spoke.serve.objects import ObjectReads, Prepared, boundary_watch, watched
from spoke.serve.plain import (
    OBJECTS,
    PlainReads,
    answerable_now,
    read_cached_body,
    send_file_range,
    sendfile_worthy,
)
from spoke.upstream.errors import StaleVersion

logger = logging.getLogger(__name__)

# Writes the answer to a request that failed with an error, before any of its head.
ProblemWriter = Callable[[FastConnection, RequestHead, ProtocolError], Reply]


class FastObjectReads:
    """The spoke app's :data:`service.fast.FastHandler`."""

    def __init__(
        self, app: web.Application, reads_key: web.AppKey[ObjectReads],
        problem: ProblemWriter | None = None,
    ) -> None:
        self.app = app
        self.reads_key = reads_key
        # How an error is answered: problem+json; the S3 front end's own in its XML.
        self._problem: ProblemWriter = problem or _problem
        self._plain = PlainReads()
        self._hits: _CacheHits | None = None

    def __call__(self, head: RequestHead, conn: FastConnection) -> Reply | Awaitable[Reply] | None:
        reads = self.app.get(self.reads_key)
        if reads is None or not head.target.startswith(OBJECTS):
            return None
        try:
            path = self._plain.object_path(head.target)
            tenant = self._tenant(head, path)
        except ProtocolError:
            return None  # aiohttp answers the 400/401/403, and counts it
        return self.read(reads, head, conn, path, tenant)

    def read(
        self, reads: ObjectReads, head: RequestHead, conn: FastConnection, path: str,
        tenant: str,
    ) -> Reply | Awaitable[Reply] | None:
        """:meth:`__call__` once ``head`` is known to read object ``path`` (valid), as
        ``tenant`` (its token's, checked): for a front end that knows both already."""
        limit = self.app.get(LIMIT)
        if limit is not None and not limit.acquire(conn.client):
            limit.rejected -= 1  # aiohttp answers the 429, and counts it
            return None
        started = time.perf_counter()
        manifest = reads.cache.fresh_manifest(path)
        prepared = None
        if manifest is not None:
            hits = self._hits
            if hits is None or hits.reads is not reads:
                hits = self._hits = _CacheHits(reads)
            reply = self._plain.answer(hits, conn, head, path, manifest)
            if reply is None:
                large = self._plain.answer_large(hits, conn, head, path, manifest)
                if large is not None and not isinstance(large, Reply):
                    return self._sending(reads, conn, large, started)
                reply = large
            if reply is not None:
                if limit is not None:
                    limit.release(conn.client)
                reads.observe_latency("HIT", time.perf_counter() - started)
                return reply
            try:
                prepared = reads.prepare(head.method, head.headers, path, manifest, False, tenant)
                reply = _answer_now(reads, hits, conn, head, prepared, manifest)
            except ProtocolError as exc:
                reply = self._problem(conn, head, exc)
            if reply is not None:
                if limit is not None:
                    limit.release(conn.client)
                if prepared is not None:
                    reads.observe_latency(prepared.x_cache, time.perf_counter() - started)
                return reply
        return self._answer(reads, conn, head, path, tenant, started, prepared, manifest)

    async def _sending(
        self, reads: ObjectReads, conn: FastConnection, sending: Awaitable[Reply],
        started: float,
    ) -> Reply:
        """A plain read's bytes the socket did not take at once, being sent."""
        try:
            reply = await sending
        finally:
            limit = self.app.get(LIMIT)
            if limit is not None:
                limit.release(conn.client)
        reads.observe_latency("HIT", time.perf_counter() - started)
        return reply

    def _tenant(self, head: RequestHead, path: str) -> str:
        guard = self.app.get(GUARD)
        if guard is None:
            return ""
        claims = guard.authenticate(head.headers.get("Authorization"))
        authorize(claims, path)
        return claims.tenant

    async def _answer(
        self, reads: ObjectReads, conn: FastConnection, head: RequestHead, path: str,
        tenant: str, started: float, prepared: Prepared | None, manifest: Manifest | None,
    ) -> Reply:
        early = None if manifest is not None else \
            reads.fetch_early(head.method, head.headers, path)
        try:
            try:
                reply = await _serve(reads, conn, head, path, tenant, prepared, manifest)
            except StaleVersion:
                # Changed between our metadata and the first chunk: answer the new
                # version from the start rather than splicing two.
                reads.cache.invalidate(path)
                reply = await _serve(reads, conn, head, path, tenant, None, None)
        except ProtocolError as exc:
            return self._problem(conn, head, exc)
        finally:
            reads.cache.drop_early(early)  # a no-op once a chunk flight took it on
            limit = self.app.get(LIMIT)
            if limit is not None:
                limit.release(conn.client)
        if reply.x_cache is not None:
            reads.observe_latency(reply.x_cache, time.perf_counter() - started)
        return reply


async def _serve(
    reads: ObjectReads, conn: FastConnection, head: RequestHead, path: str, tenant: str,
    prepared: Prepared | None, manifest: Manifest | None,
) -> Reply:
    if prepared is None or manifest is None:
        manifest, stale = await reads.cache.manifest(path)
        prepared = reads.prepare(head.method, head.headers, path, manifest, stale, tenant)
    reader = reads.reader(manifest, tenant)
    first = prepared.first_chunk
    primed = first is not None and not (
        sendfile_worthy(conn, prepared.plan.ranges[0]) and reads.cache.is_cached(manifest, first)
    )
    for prime in prepared.primes:  # a failure still gets a status
        if primed or prime.index != first:  # else the first goes by sendfile, unprimed
            await reader.prime(prime.index, prime.within)
    plan = prepared.plan
    reads.sending(prepared)
    conn.write(conn.head(plan.status, prepared.headers, head.keep_alive))
    if not prepared.has_body or head.method == "HEAD":
        return Reply(plan.status, 0, prepared.x_cache)
    sent = 0

    async def write(data: bytes | memoryview) -> None:
        nonlocal sent
        conn.write(data)
        sent += len(data)
        await conn.drain()

    # A multipart body's bytes all pass the boundary check, none goes by sendfile.
    watch = boundary_watch(plan)
    try:
        for part in plan.body:
            if isinstance(part, bytes):
                await write(part)
                continue
            # The primed chunk is the reader's: counted once, read once.
            done = 0 if primed or watch else await _sendfile_prefix(reads, conn, manifest, part)
            primed = False
            sent += done
            if done < part.length:
                await reader.write(ByteRange(part.start + done, part.stop), watched(watch, write))
    except ConnectionError:
        raise
    except Exception as exc:
        # Headers are gone: the only honest signal left is a cut connection, which
        # the client sees as a short body. Never pad or splice other bytes in.
        logger.warning("aborting %s %s mid-body: %s", head.method, head.target, exc)
        conn.abort()
    return Reply(plan.status, sent, prepared.x_cache)


def _answer_now(
    reads: ObjectReads, hits: _CacheHits, conn: FastConnection, head: RequestHead,
    prepared: Prepared, manifest: Manifest,
) -> Reply | None:
    """Answer from cached chunks within this callback, or None (not all cached, too
    large, or a chunk file gone) and nothing sent."""
    plan = prepared.plan
    if not prepared.has_body or head.method == "HEAD":
        conn.writelines([conn.head(plan.status, prepared.headers, head.keep_alive)])
        return Reply(plan.status, 0, prepared.x_cache)
    if prepared.x_cache != "HIT" or not answerable_now(conn, plan):
        return None
    try:
        read = read_cached_body(hits, manifest, plan, zero_copy=conn.can_sendfile)
    except ChunkGone:
        return None  # deleted behind our back: the slow way fetches it again
    if read is None:
        return None
    if read[0] is not plan:
        prepared = prepared.with_plan(read[0])
    plan, body = read
    reads.cache.stats.bytes_served_hit += sum(r.length for r in plan.ranges)
    conn.writelines([conn.head(plan.status, prepared.headers, head.keep_alive), *body])
    return Reply(plan.status, plan.content_length, prepared.x_cache)


async def _sendfile_prefix(
    reads: ObjectReads, conn: FastConnection, manifest: Manifest, r: ByteRange
) -> int:
    """Send the cached chunks at the start of a large range with sendfile; returns
    how many of its bytes went (0 for a small range, a miss first, or TLS)."""
    if not sendfile_worthy(conn, r):
        return 0
    cache = reads.cache
    done = 0
    for s in chunk_slices(r, manifest.size, manifest.chunk_size):
        if not cache.is_cached(manifest, s.index):
            break
        try:
            fd = cache.open_fd(manifest, s.index, s.stop)
        except ChunkGone:
            break  # the reader fetches it again
        cache.lookup(manifest, s.index)  # counted as a loader's hit
        try:
            await send_file_range(conn, fd, s.start, s.stop)
        finally:
            os.close(fd)
        done += s.stop - s.start
        cache.stats.bytes_served_hit += s.stop - s.start
    return done


class _CacheHits:
    """The spoke's own cache as the source of plain reads."""

    __slots__ = ("cache", "reads")

    def __init__(self, reads: ObjectReads) -> None:
        self.reads, self.cache = reads, reads.cache

    def is_resident(self, name: str) -> bool:
        return self.cache.is_resident(name)

    def read_hit(self, name: str, start: int, stop: int) -> bytes:
        return self.cache.read_hit(name, start, stop)

    def peek(self, name: str, start: int, stop: int) -> bytes:
        return self.cache.peek(name, start, stop)

    def view_hit(self, name: str, start: int, stop: int) -> memoryview:
        return self.cache.view_hit(name, start, stop)

    def fd_hit(self, name: str, need_bytes: int) -> int:
        return self.cache.fd_hit(name, need_bytes)

    def open_hit(self, name: str, need_bytes: int) -> int:
        # A descriptor of its own: the open chunks' may be closed while it is sent.
        return os.dup(self.cache.fd_hit(name, need_bytes))

    def forget(self, name: str) -> None:
        self.cache.forget(name)

    def served(self, manifest: Manifest, ranges: list[ByteRange]) -> None:
        self.cache.stats.bytes_served_hit += sum(r.length for r in ranges)
        self.reads.readahead.observe(manifest, ranges)


def _problem(conn: FastConnection, head: RequestHead, exc: ProtocolError) -> Reply:
    """The answer :mod:`service.problem`'s middleware gives for ``exc``."""
    status = exc.status_hint
    body = problem_body(status, exc.title, str(exc))
    headers = [
        ("Content-Type", f"{PROBLEM_JSON}; charset=utf-8"), ("Content-Length", str(len(body))),
        *error_headers(exc).items(),
    ]
    sent = b"" if head.method == "HEAD" else body
    conn.writelines([conn.head(status, headers, head.keep_alive), sent])
    return Reply(status, len(sent))
