"""make_s3_app(spoke_app): the S3 API, a second front end over the spoke's objects.

One aiohttp application on its own port, sharing everything of the spoke's app (its
cache, reads, plans, read-ahead, warm jobs, limits, metrics): it reaches them through
:data:`SPOKE`, so a chunk read through S3 is a hit through ``/objects`` and back.
It serves in the spoke's own process (with ``--workers``, the owner's, while reader
workers answer warm reads on its port: :mod:`spoke.workers.s3`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web

from protocol.s3 import requests as s3
from protocol.s3.credentials import S3Key
from protocol.s3.errors import InvalidArgument, NoSuchBucket, NoSuchKey
from protocol.s3.requests import Operation
from service import front, limits, logs
from service.fast import FAST, FastHandler
from spoke.s3 import listing, objects
from spoke.s3.access import S3Access, check_object
from spoke.s3.errors import AMZ_REQUEST_ID, ERRORS, refusal_response, s3_error_middleware
from spoke.s3.fast import S3FastReads
from spoke.s3.stats import S3_STATS
from spoke.serve import handlers
from spoke.upstream.errors import GoneAtHub

logger = logging.getLogger(__name__)

SPOKE = web.AppKey("spoke_app", web.Application)
DOMAIN = web.AppKey("s3_domain", str)
ACCESS = web.AppKey("s3_access", S3Access)


def make_s3_app(
    spoke: web.Application, domain: str | None = None,
    keys: Mapping[str, S3Key] | None = None, access: S3Access | None = None,
) -> web.Application:
    """The S3 front end of ``spoke`` (a :func:`spoke.app.make_app` application).
    ``domain``: virtual-hosted buckets are ``{bucket}.{domain}``; ``keys``: SigV4 is
    required, with these keys (``access``: the same with a clock of one's own)."""
    app = web.Application(middlewares=[s3_error_middleware])
    logs.install(app)
    front.install(app)
    app[front.FRONT].render = refusal_response
    limit = spoke.get(limits.LIMIT)
    if limit is not None:
        # Inside the error middleware, which answers its 429 as S3's 503 SlowDown; one
        # count per client address over both front ends.
        app.middlewares.append(limits.middleware(limit))
    if limits.KEEPALIVE in spoke:
        app[limits.KEEPALIVE] = spoke[limits.KEEPALIVE]
    if limits.CONNECTIONS in spoke:
        app[limits.CONNECTIONS] = spoke[limits.CONNECTIONS]
    app[SPOKE] = spoke
    app[DOMAIN] = domain or ""
    app[ACCESS] = access if access is not None else S3Access(keys)
    app[ERRORS] = spoke[S3_STATS].errors
    meta_ttl_s = spoke[handlers.CONFIG].meta_ttl_s
    app[listing.BUCKETS] = listing.KnownBuckets(
        max(listing.BUCKET_TTL_S, meta_ttl_s), listing.RecentListings(meta_ttl_s))
    fast: FastHandler = S3FastReads(spoke, app[ACCESS], domain, app[listing.BUCKETS])
    app[FAST] = fast
    app.on_response_prepare.append(_add_amz_request_id)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


async def _add_amz_request_id(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get(logs.REQUEST_ID_KEY)
    if rid is not None:
        response.headers[AMZ_REQUEST_ID] = rid


def _raw_target(request: web.Request) -> tuple[str, str]:
    """The request target's path and query, both still percent-encoded."""
    path, _, query = request.raw_path.partition("?")
    return path, query


async def dispatch(request: web.Request) -> web.StreamResponse:
    spoke = request.app[SPOKE]
    raw_path, raw_query = _raw_target(request)
    params = s3.parse_query(raw_query)
    host_bucket = s3.bucket_from_host(request.host, request.app[DOMAIN] or None)
    where = s3.target(raw_path, host_bucket)
    op = s3.operation(request.method, where, params)
    spoke[S3_STATS].requests[op.value] += 1
    if request.method == "GET" and (request.content_length or request.body_exists):
        raise InvalidArgument("a GET carries no body")
    key = request.app[ACCESS].caller(request.method, raw_path, raw_query,
                                     request.headers.items())
    known = request.app[listing.BUCKETS]
    if op is Operation.GET_OBJECT or op is Operation.HEAD_OBJECT:
        check_object(key, where.path)  # before any byte, cached or not
        if where.path.endswith("/"):
            raise NoSuchKey(f"no object {where.path!r}")
        try:
            return await objects.get_object(request, spoke, where.path, params)
        except GoneAtHub:
            if where.bucket is not None and not await known.exists(spoke, where.bucket):
                raise NoSuchBucket(f"no bucket {where.bucket!r}") from None
            raise
    if op is Operation.LIST_BUCKETS:
        return await listing.list_buckets(spoke, known, key)
    assert where.bucket is not None
    if op is Operation.HEAD_BUCKET:
        return await listing.head_bucket(spoke, known, where.bucket, key)
    if op is Operation.GET_BUCKET_LOCATION:
        return await listing.bucket_location(spoke, known, where.bucket, key)
    v2 = op is Operation.LIST_OBJECTS_V2
    return await listing.list_objects(spoke, known, where.bucket, s3.list_params(params, v2),
                                      key)

