"""The hub's HTTP handlers: parse through protocol/, call one object, respond."""

from __future__ import annotations

import asyncio
import secrets

import msgpack
from aiohttp import web

from hub.backend import Backend, OpenObject
from hub.manifests import ManifestCache
from hub.stats import HubStats
from protocol.manifest import encode_manifest
from protocol.paths import validate_path, validate_prefix
from protocol.ranges import ByteRange
from protocol.response import Representation, plan_response
from service.body import send_plan
from service.metrics import metrics_response

BACKEND = web.AppKey("backend", Backend)
MANIFESTS = web.AppKey("manifests", ManifestCache)
STATS = web.AppKey("stats", HubStats)
REGISTRY = web.AppKey("registry", object)

# Large enough to keep per-block overhead small, small enough to bound memory
# per connection.
READ_BLOCK_BYTES = 1 << 20


async def get_object(request: web.Request) -> web.StreamResponse:
    path = validate_path(request.match_info["path"])
    backend = request.app[BACKEND]
    loop = asyncio.get_running_loop()
    obj = await loop.run_in_executor(None, backend.open, path)
    try:
        info = obj.info
        rep = Representation(info.size, info.etag, info.mtime, info.content_type)
        plan = plan_response(request.method, request.headers, rep, secrets.token_hex(12))
        stats = request.app[STATS]

        async def write_range(r: ByteRange, response: web.StreamResponse) -> None:
            await _stream_file_range(obj, r, response, stats)

        return await send_plan(request, plan, write_range)
    finally:
        await loop.run_in_executor(None, obj.close)


async def _stream_file_range(
    obj: OpenObject, r: ByteRange, response: web.StreamResponse, stats: HubStats
) -> None:
    loop = asyncio.get_running_loop()
    offset = r.start
    while offset < r.stop:
        length = min(READ_BLOCK_BYTES, r.stop - offset)
        block = await loop.run_in_executor(None, obj.read, offset, length)
        if len(block) != length:
            # The file shrank under an open response: cut it rather than pad.
            raise ConnectionResetError(f"{obj.info.path} changed while being sent")
        await response.write(block)
        stats.bytes_sent += length
        offset += length


async def get_manifest(request: web.Request) -> web.Response:
    path = validate_path(request.match_info["path"])
    manifest = await request.app[MANIFESTS].get(path)
    request.app[STATS].manifests_served += 1
    return web.Response(
        body=encode_manifest(manifest),
        content_type="application/msgpack",
        headers={"ETag": manifest.etag},
    )


async def get_list(request: web.Request) -> web.Response:
    prefix = validate_prefix(request.match_info.get("prefix", ""))
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(None, request.app[BACKEND].list, prefix)
    entries = [{"path": i.path, "size": i.size, "etag": i.etag} for i in infos]
    return list_response(request, prefix, entries)


def list_response(
    request: web.Request, prefix: str, entries: list[dict[str, object]]
) -> web.Response:
    """``/list`` answers JSON, or msgpack when the client accepts it."""
    if "application/msgpack" in request.headers.get("Accept", ""):
        body = msgpack.packb({"prefix": prefix, "objects": entries}, use_bin_type=True)
        return web.Response(body=body, content_type="application/msgpack")
    return web.json_response({"prefix": prefix, "objects": entries})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CollectorRegistry

    registry = request.app[REGISTRY]
    assert isinstance(registry, CollectorRegistry)
    return metrics_response(registry)
