"""The hub's HTTP handlers: parse through protocol/, call one object, respond."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from hub.backend import Backend, ObjectInfo, OpenObject
from hub.manifests import ManifestCache
from hub.relay import StoreBody, relay_blocking
from hub.stats import HubStats
from protocol.manifest import encode_manifest
from protocol.multipart import boundary_avoiding, boundary_occurs, new_boundary
from protocol.paths import validate_path, validate_prefix
from protocol.ranges import ByteRange
from protocol.response import Representation, ResponsePlan, plan_response, reframed
from service.body import send_plan
from service.listing import list_response, stream_list_response
from service.metrics import metrics_response

BACKEND = web.AppKey("backend", Backend)
MANIFESTS = web.AppKey("manifests", ManifestCache)
STATS = web.AppKey("stats", HubStats)
REGISTRY = web.AppKey("registry", object)

# Large enough to keep per-block overhead small, small enough to bound memory
# per connection.
READ_BLOCK_BYTES = 1 << 20
# Ranges at least this long go from the file to the socket with os.sendfile: no
# copy through Python, no buffer to allocate, one thread hop per range instead of
# one per block. uvloop has no loop.sendfile (aiohttp's FileResponse falls back to
# reading blocks in the thread pool there), so the call runs in a thread of its
# own, where a page-cache miss may block; the event loop never does.
SENDFILE_MIN_BYTES = 256 << 10
# Threads sending at once; a transfer waiting on a slow client holds one.
SENDFILE_THREADS = 32
# A transfer that makes no progress for this long is abandoned (the client stalled).
SENDFILE_STALL_S = 60.0
_sendfile_pool: ThreadPoolExecutor | None = None
# Listing entries per executor hop when a backend lists page by page.
LIST_BATCH = 1000


async def get_object(request: web.Request) -> web.StreamResponse:
    path = validate_path(request.match_info["path"])
    backend = request.app[BACKEND]
    loop = asyncio.get_running_loop()
    quick = getattr(backend, "opens_quickly", False)
    # A store's opens wait on its answers: in threads of its own, as many as it has
    # connections (the default executor's few would cap the reads in flight).
    executor = getattr(backend, "executor", None)
    obj = backend.open(path) if quick else await loop.run_in_executor(
        executor, _open, backend, path, request.headers.get("If-Match"),
        request.headers.get("Range"),
    )
    try:
        info = obj.info
        rep = Representation(info.size, info.etag, info.mtime_ns, info.content_type)
        plan = plan_response(
            request.method, request.headers, rep, new_boundary, int(time.time())
        )
        if plan.boundary is not None:
            plan = await loop.run_in_executor(None, _boundary_clear_of_data, obj, plan)
        stats = request.app[STATS]

        async def write_range(r: ByteRange, response: web.StreamResponse) -> None:
            if not await _sendfile_range(request, obj, r, response, stats):
                await _stream_file_range(obj, r, response, stats)

        return await send_plan(request, plan, write_range)
    finally:
        if quick:
            obj.close()
        else:
            await loop.run_in_executor(None, obj.close)


def _open(backend: Backend, path: str, if_match: str | None, range_value: str | None
          ) -> OpenObject:
    """``backend.open``; a backend that can open and read in one request (an object
    store's ``open_for_request``) is told what the request asks for."""
    open_for_request = getattr(backend, "open_for_request", None)
    if open_for_request is not None:
        obj: OpenObject = open_for_request(path, if_match, range_value)
        return obj
    return backend.open(path)


def _boundary_clear_of_data(obj: OpenObject, plan: ResponsePlan) -> ResponsePlan:
    """``plan``, reframed if its boundary occurs in the bytes of its parts (blocking).

    The bytes are read here once more (from the page cache, as they are about to be
    sent): a multipart answer from the hub is a direct client's, not a spoke's fill.
    """
    assert plan.boundary is not None
    if not any(boundary_occurs(plan.boundary, _blocks(obj, r)) for r in plan.ranges):
        return plan
    parts: list[list[bytes | bytearray | memoryview]] = [
        list(_blocks(obj, r)) for r in plan.ranges
    ]
    return reframed(plan, boundary_avoiding(parts))


def _blocks(obj: OpenObject, r: ByteRange) -> Iterator[bytes]:
    for offset in range(r.start, r.stop, READ_BLOCK_BYTES):
        block = obj.read(offset, min(READ_BLOCK_BYTES, r.stop - offset))
        yield block
        if not block:
            return  # shrunk under us: the send cuts the answer


async def _stream_file_range(
    obj: OpenObject, r: ByteRange, response: web.StreamResponse, stats: HubStats
) -> None:
    loop = asyncio.get_running_loop()
    will_read = getattr(obj, "will_read", None)
    if will_read is not None:
        will_read(r.start, r.stop)  # a store object then reads the range with one request
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


async def _sendfile_range(
    request: web.Request, obj: OpenObject, r: ByteRange, response: web.StreamResponse,
    stats: HubStats,
) -> bool:
    """Send ``r`` from a thread straight to the socket; False (nothing sent) when this
    response cannot: ``os.sendfile`` from a file, a relay from an object store's GET
    (:func:`relay_blocking`), one thread hop per range either way."""
    fileno = getattr(obj, "fileno", None)
    store_body = obj if isinstance(obj, StoreBody) else None  # an object store's GET
    transport = request.transport
    if (fileno is None and store_body is None) or transport is None \
            or r.length < SENDFILE_MIN_BYTES:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        return False
    await response.write(b"")  # the headers (and any multipart boundary) go first
    if transport.is_closing():
        raise ConnectionResetError("client went away")
    if transport.get_write_buffer_size():
        return False  # bytes still queued in the transport must not be overtaken
    # A descriptor of our own: the transport may close its one meanwhile (a client
    # hanging up), and its number could then name another connection.
    sock_fd = os.dup(sock.fileno())
    stop = threading.Event()
    try:
        loop = asyncio.get_running_loop()
        if fileno is not None:
            sent = await loop.run_in_executor(
                sendfile_pool(), sendfile_blocking, sock_fd, fileno(), r.start, r.length, stop
            )
        else:
            assert store_body is not None  # one of the two, checked above
            will_read = getattr(obj, "will_read", None)
            if will_read is not None:
                will_read(r.start, r.stop)  # a store object reads the range with one GET
            sent = await loop.run_in_executor(
                sendfile_pool(), relay_blocking, sock_fd, store_body, r.start, r.length, stop
            )
    finally:
        stop.set()  # the thread may still run if we were cancelled: make it stop
    stats.bytes_sent += sent
    writer = getattr(response, "_payload_writer", None)
    if writer is not None:
        writer.output_size += sent  # keeps the access log's byte count right
    if sent != r.length:
        # The file shrank under an open response: cut it rather than pad.
        raise ConnectionResetError(f"{obj.info.path} changed while being sent")
    return True


def sendfile_pool() -> ThreadPoolExecutor:
    """The threads :func:`sendfile_blocking` runs in (also the fast path's)."""
    global _sendfile_pool
    if _sendfile_pool is None:
        _sendfile_pool = ThreadPoolExecutor(SENDFILE_THREADS, thread_name_prefix="hub-sendfile")
    return _sendfile_pool


def sendfile_blocking(
    sock_fd: int, fd: int, offset: int, count: int, stop: threading.Event
) -> int:
    """Send ``count`` bytes of ``fd`` from ``offset``; returns how many the file had.

    Owns (and closes) ``sock_fd``, a duplicate of the non-blocking socket: waits for
    room in it with poll, so a slow client holds this thread, not the event loop.
    """
    sent = 0
    poller = select.poll()
    poller.register(sock_fd, select.POLLOUT)
    progress_at = time.monotonic()
    try:
        while sent < count:
            if stop.is_set():
                raise ConnectionResetError("response abandoned")
            try:
                n = os.sendfile(sock_fd, fd, offset + sent, count - sent)
            except BlockingIOError:
                n = -1
            except OSError as exc:
                raise ConnectionResetError(f"client went away: {exc}") from None
            if n == 0:
                break  # end of file
            if n > 0:
                sent += n
                progress_at = time.monotonic()
                continue
            if time.monotonic() - progress_at > SENDFILE_STALL_S:
                raise ConnectionResetError("client stopped reading")
            poller.poll(250)
        return sent
    finally:
        with contextlib.suppress(OSError):
            os.close(sock_fd)


async def get_manifest(request: web.Request) -> web.Response:
    path = validate_path(request.match_info["path"])
    manifest = await request.app[MANIFESTS].get(path)
    request.app[STATS].manifests_served += 1
    return web.Response(
        body=encode_manifest(manifest),
        content_type="application/msgpack",
        headers={"ETag": manifest.etag},
    )


async def get_list(request: web.Request) -> web.StreamResponse:
    prefix = validate_prefix(request.match_info.get("prefix", ""))
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(None, request.app[BACKEND].list, prefix)
    if isinstance(infos, list):
        entries: list[dict[str, object]] = [_entry(i) for i in infos]
        return list_response(request.headers.get("Accept", ""), prefix, entries)
    # An iterator (an object store's pages): streamed, a batch per executor hop.
    objects = iter(infos)

    def next_batch() -> list[dict[str, object]]:
        return [_entry(i) for i in itertools.islice(objects, LIST_BATCH)]

    return await stream_list_response(
        request, prefix, lambda: loop.run_in_executor(None, next_batch)
    )


def _entry(info: ObjectInfo) -> dict[str, object]:
    return {"path": info.path, "size": info.size, "etag": info.etag}


async def healthz(request: web.Request) -> web.Response:
    # The chunk size lets a spoke that has seen no manifest yet ask for an object's
    # first chunk alongside its manifest (spoke.cache.early).
    return web.json_response(
        {"status": "ok", "chunk_size": request.app[MANIFESTS].chunk_size}
    )


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CollectorRegistry

    registry = request.app[REGISTRY]
    assert isinstance(registry, CollectorRegistry)
    return metrics_response(registry)
