"""The S3 front end's fast path: GetObject and HeadObject without aiohttp.

A path-style ``GET``/``HEAD /{bucket}/{key}`` is the ``/objects`` read of
``{bucket}/{key}``, answered by ``/objects``' own fast path
(:class:`spoke.serve.fast.FastObjectReads`: cached ranges by ``pread``/``writev`` or
``sendfile``, misses through the cache) with S3's request id in its head and S3's XML
for its errors. With keys the signature is checked here first. What S3 answers
otherwise (a HeadObject's Range, several ranges, overrides, virtual hosts, any field
but a loader's and an SDK's) is declined, and aiohttp answers it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import NamedTuple

from aiohttp import web

from protocol.errors import ProtocolError
from protocol.http1 import Headers, RequestHead
from protocol.paths import validate_path
from protocol.s3 import xml
from protocol.s3.requests import Operation, bucket_from_host, decodes, target
from protocol.s3.sigv4 import AUTH_QUERY_PARAMS, Verified, epoch_s
from service.auth import GUARD
from service.fast import FastConnection, Reply
from service.limits import LIMIT
from service.problem import error_headers
from spoke.s3.access import S3Access, check_object
from spoke.s3.errors import AMZ_REQUEST_ID, s3_code
from spoke.s3.listing import KnownBuckets
from spoke.s3.stats import S3_STATS, S3Stats
from spoke.serve import handlers
from spoke.serve.fast import FastObjectReads
from spoke.serve.objects import ObjectReads
from spoke.serve.plain import OBJECTS, PLAIN_FIELDS

# What S3 clients add to a read: their signature (checked, or ignored when anonymous),
# SDK bookkeeping, and conditionals (the planner's, as for /objects).
S3_FIELDS = frozenset({
    "authorization", "x-amz-date", "x-amz-content-sha256", "amz-sdk-invocation-id",
    "amz-sdk-request", "x-amz-user-agent",
    # botocore asks for the object's stored checksums: we keep none, and send none.
    "x-amz-checksum-mode",
})
CONDITIONALS = frozenset({"if-match", "if-none-match", "if-modified-since",
                          "if-unmodified-since"})
READ_FIELDS = PLAIN_FIELDS | CONDITIONALS
FAST_FIELDS = READ_FIELDS | S3_FIELDS
# Query parameters a fast read may carry: a presigned URL's, and botocore's ``x-id``.
FAST_PARAMS = frozenset({*AUTH_QUERY_PARAMS, "x-id"}) - {"X-Amz-Security-Token"}
MAX_REMEMBERED_TARGETS = 10_000


class FastRead(NamedTuple):
    """A request target a fast read may have (its path and query as sent, and the object
    they name), and ``objects_target``: the ``/objects`` read of it. Made once per
    target; its strings, hashed once, are the keys of the memos it is looked up in."""

    raw_path: str  # as the request named it, for its errors' Resource
    raw_query: str
    bucket: str
    path: str
    objects_target: str


# A fast path's fields are keyed by lower-case name: dict's own methods skip Headers' lower().
_field = dict.get


class FastTargets:
    """Which S3 requests a fast path answers (the spoke's, a reader worker's), each as
    the ``/objects`` read it is; signed as ``access`` requires, within its key's scope."""

    def __init__(self, access: S3Access, domain: str | None) -> None:
        self.access = access
        self.domain = domain
        # By request target, as sent. A loader sends the same ones again and again
        # (a presigned URL's above all), and the head reader hands back the same string
        # for each: its hash is computed once, and so are those of the parts kept here,
        # which the signature's memo is keyed by.
        self._targets: dict[str, FastRead | None] = {}
        # By target, the last verdict on its signature (its key, its age), found within
        # the key's scope for the target's object: a request of the same target (every
        # character: it is the key) whose verdict holds (the same method, the same signed
        # fields, the same key, still in date) is the same request, and so is its answer.
        self._verified: dict[str, Verified] = {}

    def read(self, head: RequestHead) -> tuple[FastRead, S3ReadHead] | None:
        """``head`` as a fast read and its ``/objects`` head, or None: aiohttp's to
        answer (a refusal included)."""
        fields = head.headers
        if not FAST_FIELDS.issuperset(fields):
            return None
        if self.domain and bucket_from_host(_field(fields, "host") or "", self.domain):
            return None  # virtual-hosted: aiohttp's
        try:
            named = self._targets[head.target]
        except KeyError:
            named = self._named(head.target)
        if named is None:
            return None
        rng = _field(fields, "range")
        if rng is not None and ("," in rng or head.method == "HEAD"):
            return None  # several ranges (S3: the whole object), HeadObject's 206: aiohttp's
        access = self.access
        keys = access.keys
        if keys is not None:
            seen = self._verified.get(head.target)
            now = access.now()
            if seen is None or not seen.holds(
                    head.method, fields, keys, now if type(now) is float else epoch_s(now)):
                try:
                    seen = access.verified(head.method, named.raw_path, named.raw_query, fields)
                    check_object(seen.key, named.path)
                except ProtocolError:
                    return None  # aiohttp answers the 403, and counts it
                self._verified[head.target] = seen
        if not READ_FIELDS.issuperset(fields):
            fields = Headers({k: v for k, v in fields.items() if k in READ_FIELDS})
        return named, S3ReadHead(head.method, named.objects_target, fields, head.keep_alive,
                                 named.raw_path)

    def _named(self, request_target: str) -> FastRead | None:
        """The object path-style ``request_target`` names, with a query a fast read may
        carry; or None (not an object, another query, or invalid: aiohttp's to
        refuse). Validated once, then remembered."""
        raw_path, _, raw_query = request_target.partition("?")
        named = None
        try:
            where = target(raw_path, None)
            if where.bucket and where.key and not where.key.endswith("/") \
                    and _fast_query(raw_query):
                # As /objects' fast path validates its paths: S3's reads skip that step.
                path = validate_path(where.path)
                named = FastRead(raw_path, raw_query, where.bucket, path, f"{OBJECTS}{path}")
        except ProtocolError:
            named = None
        if len(self._targets) >= MAX_REMEMBERED_TARGETS:
            self._targets.clear()
            self._verified.clear()
        self._targets[request_target] = named
        return named


@dataclass(slots=True)
class S3ReadHead(RequestHead):
    """The ``/objects`` head of an S3 read, and ``resource``: the path the S3 request
    named, for its errors' Resource."""

    resource: str


class S3FastReads:
    """The S3 app's :data:`service.fast.FastHandler`."""

    takes_queries = True  # keys are percent-encoded, presigned URLs carry a query
    request_id_header = AMZ_REQUEST_ID  # every head the fast path writes carries it

    def __init__(
        self, spoke: web.Application, access: S3Access, domain: str | None,
        buckets: KnownBuckets,
    ) -> None:
        self.spoke = spoke
        self.targets = FastTargets(access, domain)
        self.buckets = buckets
        self._objects = FastObjectReads(spoke, handlers.READS, self._problem)
        # Set by make_app, before this: read once, not per request.
        self._stats = spoke[S3_STATS]
        self._hit_latency = self._stats.read_latency["hit"]
        self._guarded = GUARD in spoke
        self._reads: ObjectReads | None = None

    def __call__(
        self, head: RequestHead, conn: FastConnection
    ) -> Reply | Awaitable[Reply | None] | None:
        reads = self._reads
        if reads is None:
            # Set once the spoke's cache is open, then for good.
            reads = self._reads = self.spoke.get(handlers.READS)
            if reads is None:
                return None
        if self._guarded:
            return None  # (guarded: /objects' fast path would ask for a bearer token)
        read = self.targets.read(head)
        if read is None:
            return None
        named, plain = read
        unknown = not self.buckets.known(named.bucket)
        if unknown and reads.cache.fresh_manifest(named.path) is not None:
            self.buckets.saw(named.bucket)  # it holds an object
            unknown = False
        if unknown:
            return self._once_known(reads, plain, conn, named)
        return self._delegate(reads, plain, conn, named.path)

    async def _once_known(
        self, reads: ObjectReads, plain: S3ReadHead, conn: FastConnection, named: FastRead,
    ) -> Reply | None:
        """A read in a bucket not known to exist yet: its manifest first. Found, the
        bucket exists and the read goes on here; not (a 404 must say NoSuchBucket or
        NoSuchKey, and only a listing tells) or any other failure, nothing is sent and
        aiohttp answers."""
        limit = self.spoke.get(LIMIT)
        if limit is not None and not limit.acquire(conn.client):
            limit.rejected -= 1  # aiohttp answers (503 SlowDown), and counts it
            return None
        try:
            await reads.cache.manifest(named.path)
        except Exception:  # nothing is sent yet: aiohttp answers, in S3's words
            return None
        finally:
            if limit is not None:
                limit.release(conn.client)
        self.buckets.saw(named.bucket)
        answer = self._delegate(reads, plain, conn, named.path)
        return answer if answer is None or isinstance(answer, Reply) else await answer

    def _delegate(
        self, reads: ObjectReads, plain: S3ReadHead, conn: FastConnection, path: str,
    ) -> Reply | Awaitable[Reply | None] | None:
        started = time.perf_counter()
        # The path is valid (FastTargets), and no token is asked for (not guarded).
        answer = self._objects.read(reads, plain, conn, path, "")
        if answer is None:
            return None
        op = GET_OBJECT if plain.method == "GET" else HEAD_OBJECT
        if isinstance(answer, Reply):
            if answer.x_cache == "HIT" and op is GET_OBJECT:  # counted(), inline: the warm read
                self._stats.requests[op] += 1
                self._hit_latency.observe(time.perf_counter() - started)
            else:
                counted(self._stats, op, answer, started)
            return answer
        return self._when_done(answer, self._stats, op, started)

    async def _when_done(
        self, answer: Awaitable[Reply | None], stats: S3Stats, op: str, started: float,
    ) -> Reply | None:
        reply = await answer
        if reply is not None:
            counted(stats, op, reply, started)
        return reply

    def _problem(self, conn: FastConnection, head: RequestHead, exc: ProtocolError) -> Reply:
        """What :mod:`spoke.s3.errors`' middleware answers for ``exc``, on the fast path."""
        status, code = s3_code(exc)
        resource = head.resource if isinstance(head, S3ReadHead) else head.target
        body = xml.error(code, str(exc)[:500], resource, conn.request_id)
        headers = [("Content-Type", f"{xml.XML_TYPE}; charset=utf-8"),
                   ("Content-Length", str(len(body))), *error_headers(exc).items()]
        if status == 503 and not any(name == "Retry-After" for name, _ in headers):
            headers.append(("Retry-After", "1"))
        self._stats.errors[code] += 1
        sent = b"" if head.method == "HEAD" else body
        conn.writelines([conn.head(status, headers, head.keep_alive), sent])
        return Reply(status, len(sent))


GET_OBJECT, HEAD_OBJECT = str(Operation.GET_OBJECT.value), str(Operation.HEAD_OBJECT.value)


def counted(stats: S3Stats, op: str, reply: Reply, started: float) -> None:
    """Count a fast read's answer ``reply`` (of operation ``op``) in ``stats``."""
    stats.requests[op] += 1
    if reply.x_cache is not None and op == GET_OBJECT:
        stats.observe(reply.x_cache, time.perf_counter() - started)


def _fast_query(raw_query: str) -> bool:
    """Whether the query is one the fast path answers: only names it knows, with values
    that decode (anything else goes to the S3 app, whose query parser refuses it)."""
    if not raw_query:
        return True
    for part in raw_query.split("&"):
        name, _, value = part.partition("=")
        if name not in FAST_PARAMS or not decodes(value):
            return False
    return True
