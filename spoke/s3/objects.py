"""GetObject and HeadObject over the spoke's own reads (:class:`ObjectReads`).

The same cache, plans, read-ahead, single-flight and latency figures as ``/objects``;
what differs is S3's dialect: one range only, ``response-content-*`` overrides, and
HeadObject honouring a Range (a ``bytes=0-0`` one also warms the whole object, the
pre-stage hint CoreWeave's LOTA gives).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from aiohttp import web
from multidict import CIMultiDict

from protocol.headers import CACHE_HEADER
from protocol.manifest import Manifest
from protocol.multipart import new_boundary
from protocol.ranges import ByteRange
from protocol.response import plan_response
from protocol.s3.errors import InvalidArgument
from service.body import send_plan
from spoke.cache.keys import chunk_name, manifest_version
from spoke.s3.stats import S3_STATS
from spoke.serve import handlers
from spoke.serve.objects import STALE_HEADERS, representation
from spoke.upstream.errors import StaleVersion

logger = logging.getLogger(__name__)

# Query parameters that set a header of the answer (S3's GetObject overrides).
OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
WARM_HINT = "bytes=0-0"


def read_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The request's fields as the planner should see them: S3 serves one range, and
    ignores a Range listing several (as S3 does: the whole object)."""
    out = CIMultiDict(headers)
    rng = out.get("Range")
    if rng is not None and "," in rng:
        del out["Range"]
    return out


def overrides(params: Mapping[str, str]) -> list[tuple[str, str]]:
    found = []
    for name, header in OVERRIDES.items():
        value = params.get(name)
        if value is not None:
            if any(c in value for c in "\r\n\0"):
                raise InvalidArgument(f"{name} holds a line break")
            found.append((header, value))
    return found


async def get_object(
    request: web.Request, main: web.Application, path: str, params: Mapping[str, str]
) -> web.StreamResponse:
    cache = main[handlers.CACHE]
    headers = read_headers(request.headers)
    extra = overrides(params)
    early = main[handlers.READS].fetch_early(request.method, headers, path)
    try:
        try:
            return await _serve(request, main, path, headers, extra, *await cache.manifest(path))
        except StaleVersion:
            cache.invalidate(path)
            return await _serve(request, main, path, headers, extra, *await cache.manifest(path))
    finally:
        cache.drop_early(early)


async def _serve(
    request: web.Request, main: web.Application, path: str, headers: CIMultiDict[str],
    extra: list[tuple[str, str]], manifest: Manifest, stale: bool,
) -> web.StreamResponse:
    reads = main[handlers.READS]
    if request.method == "HEAD":
        return await _head(request, main, path, headers, extra, manifest, stale)
    prepared = reads.prepare("GET", headers, path, manifest, stale)
    reader = reads.reader(manifest, "")
    for prime in prepared.primes:
        await reader.prime(prime.index, prime.within)

    async def write_range(r: ByteRange, response: web.StreamResponse) -> None:
        await reader.write(r, response.write)

    reads.sending(prepared)
    started = time.perf_counter()
    response = await send_plan(request, prepared.plan, write_range,
                               _with(prepared.headers, extra))
    elapsed = time.perf_counter() - started
    reads.observe_latency(prepared.x_cache, elapsed)
    main[S3_STATS].observe(prepared.x_cache, elapsed)
    return response


async def _head(
    request: web.Request, main: web.Application, path: str, headers: CIMultiDict[str],
    extra: list[tuple[str, str]], manifest: Manifest, stale: bool,
) -> web.StreamResponse:
    """HeadObject: the headers a GetObject would get (its range's 206 included), at once."""
    reads = main[handlers.READS]
    prepared = reads.prepare("HEAD", headers, path, manifest, stale)
    plan = prepared.plan
    if "Range" in headers and plan.status == 200:
        plan = plan_response("GET", headers, representation(manifest, path), new_boundary,
                             int(time.time()))
    out = [*plan.headers, (CACHE_HEADER, prepared.x_cache)]
    if stale:
        out += STALE_HEADERS
    if headers.get("Range") == WARM_HINT and not _all_local(main, manifest):
        main[handlers.WARM].start(paths=[path])
    reads.sending(prepared)
    return await send_plan(request, plan, _no_body, _with(out, extra))


def _with(headers: list[tuple[str, str]], extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if not extra:
        return headers
    replaced = {name for name, _ in extra}
    return [*((n, v) for n, v in headers if n not in replaced), *extra]


def _all_local(main: web.Application, manifest: Manifest) -> bool:
    cache, version = main[handlers.CACHE], manifest_version(manifest)
    chunks = -(-manifest.size // manifest.chunk_size)
    return all(cache.is_local(chunk_name(version, i)) for i in range(chunks))


async def _no_body(r: ByteRange, response: web.StreamResponse) -> None:
    raise AssertionError("a HEAD answer has no body")
