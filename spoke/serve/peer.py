"""The peer endpoints: what one spoke of a tier asks another (:mod:`spoke.tier`).

``GET /peer/objects/{path}`` is a hub's chunk request, answered from this spoke's cache:
``Range`` one whole chunk, ``If-Match`` its version; 206 with the chunk. A chunk it does
not hold it fetches from the hub once, whoever else waits for it. ``POST
/peer/prefetch/{path}``, with the same headers, has it fetch and keep the chunk without
sending it (another spoke's warm job, plan or read-ahead). ``GET /peer/info`` says what
the tier weighs this spoke by. Both need the tier's secret as the bearer token, and
nothing else will do: a loader's token opens ``/objects/``, never these, and the tier's
secret opens only these.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from protocol.auth import AuthError, BadToken, MissingToken
from protocol.chunks import chunk_bounds
from protocol.errors import ProtocolError, RangeNotSatisfiable
from protocol.manifest import Manifest
from protocol.paths import validate_path
from protocol.ranges import ByteRange, content_range, parse_range
from service.auth import unauthorized
from spoke.serve.handlers import CACHE
from spoke.serve.reader import RangeReader
from spoke.tier.upstream import SERVING_PEER, TieredUpstream

TIER = web.AppKey("tier", TieredUpstream)
SECRET = web.AppKey("peer_secret", str)


class NotOneChunk(ProtocolError):
    """A peer asked for something other than exactly one chunk of one version."""

    title = "Not a chunk request"


class VersionGone(ProtocolError):
    status_hint = 412
    title = "Precondition Failed"


def _peer_refusal(request: web.Request) -> web.Response | None:
    """401 problem+json unless the request carries the tier's secret."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    refusal: AuthError | None = None
    if scheme.lower() != "bearer" or not token.strip():
        refusal = MissingToken("peer requests need the tier's secret as Authorization: Bearer")
    elif not hmac.compare_digest(token.strip().encode(), request.app[SECRET].encode()):
        refusal = BadToken("not the tier's secret")
    if refusal is None:
        return None
    request.app[TIER].counters.peer_refused += 1  # a spoke with another secret shows here
    return unauthorized(refusal)


async def get_peer_info(request: web.Request) -> web.Response:
    refused = _peer_refusal(request)
    if refused is not None:
        return refused
    tier = request.app[TIER]
    return web.json_response({"capacity_bytes": request.app[CACHE].capacity_bytes,
                              "advertise": tier.membership.self_url})


async def _chunk_asked(request: web.Request) -> tuple[Manifest, int, ByteRange]:
    """The version and chunk a peer request names, checked against this spoke's manifest."""
    path = validate_path(request.match_info["path"])
    etag = request.headers.get("If-Match")
    if not etag:
        raise NotOneChunk("a peer chunk request carries its version in If-Match")
    cache = request.app[CACHE]
    manifest, _ = await cache.manifest(path)
    if manifest.etag != etag:  # the asker may know a newer version than we do
        cache.invalidate(path)
        manifest, _ = await cache.manifest(path)
    if manifest.etag != etag:
        raise VersionGone(f"{path} is at another version")
    ranges = parse_range(request.headers.get("Range", ""), manifest.size)
    if ranges is None or len(ranges) != 1:
        raise NotOneChunk("a peer chunk request has Range: one chunk's bytes")
    r = ranges[0]
    index = r.start // manifest.chunk_size
    if r != chunk_bounds(index, manifest.size, manifest.chunk_size):
        raise RangeNotSatisfiable(manifest.size, "a peer asks for whole chunks")
    return manifest, index, r


async def get_peer_object(request: web.Request) -> web.StreamResponse:
    """One chunk, from this spoke's cache or fetched once from the hub for it."""
    refused = _peer_refusal(request)
    if refused is not None:
        return refused
    cache = request.app[CACHE]
    request.app[TIER].counters.peers_asked_by += 1
    serving = SERVING_PEER.set(True)  # this chunk's flight, if any, goes to the hub
    try:
        manifest, index, r = await _chunk_asked(request)
        reader = RangeReader(cache, manifest, readahead=0)
        await reader.prime(index, r)  # a failure before any byte still gets a status
        response = web.StreamResponse(status=206, headers={
            "ETag": manifest.etag, "Content-Range": content_range(r, manifest.size),
            "Content-Type": "application/octet-stream",
        })
        response.content_length = r.length
        await response.prepare(request)
        await reader.write(r, response.write)
        await response.write_eof()
        return response
    finally:
        SERVING_PEER.reset(serving)


async def post_peer_prefetch(request: web.Request) -> web.Response:
    """Prefetch one chunk this spoke keeps for the tier: a warm job, a plan or a read-ahead
    on another spoke; ``{"fetched": true}`` if it was not cached yet."""
    refused = _peer_refusal(request)
    if refused is not None:
        return refused
    request.app[TIER].counters.peer_prefetches_served += 1
    serving = SERVING_PEER.set(True)
    try:
        manifest, index, _ = await _chunk_asked(request)
        fetched = await request.app[CACHE].prefetch(manifest, index)
    finally:
        SERVING_PEER.reset(serving)
    return web.json_response({"fetched": fetched})
