"""A small real HTTP proxy in front of a real S3 store, to count and to break its answers.

The hub's client signs its requests for the proxy's address; the proxy passes them on
unchanged (``Host`` included), so the store checks the very signature the client made.
It counts what it forwards, and on request answers 503 SlowDown, holds an answer, strips
the ETag, cuts a body after some bytes, or runs a hook (overwrite, delete) just before a
GET reaches the store: faults of the store, not of our servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from service.runner import start_site

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
# The longest a gathered GET is held.
GATHER_S = 30.0
_HOP = {"transfer-encoding", "connection", "keep-alive", "content-length"}


@dataclass
class Faults:
    slow_down: int = 0  # answer this many requests 503 SlowDown
    hold_s: float = 0.0  # hold each object GET this long before forwarding it
    strip_etag: bool = False
    cut_after: int | None = None  # the next object GET's body stops after this many bytes
    before_get: Callable[[], Awaitable[None]] | None = None  # once, before the next GET
    gets: Counter[str] = field(default_factory=Counter)  # object GETs by key path
    heads: Counter[str] = field(default_factory=Counter)
    # Each object GET's If-Match and versionId, as the store received them.
    pins: list[tuple[str | None, str | None]] = field(default_factory=list)
    presigned: int = 0  # object GETs signed in their URL (a presigned URL), not a header
    # The client ends of the connections object requests came on.
    peers: set[object] = field(default_factory=set)
    requests: int = 0
    # Hold object GETs until this many are held at once (or a while has passed), and
    # record the most that were: how many reads the hub has in flight.
    gather: int = 0
    held: int = 0
    most_held: int = 0


class StoreProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = Faults()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._gathered = asyncio.Event()

    async def start(self) -> StoreProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner, port = await start_site(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def close_connections(self) -> None:
        """Close every connection clients hold to the store (idle ones, kept alive), as a
        store does once they have idled long enough; returns once they are closed."""
        assert self._runner is not None and self._runner.server is not None
        server = self._runner.server
        for handler in server.connections:
            handler.force_close()
            if handler.transport is not None:
                handler.transport.close()
        async with asyncio.timeout(10):
            while True:
                if not server.connections:
                    return
                await asyncio.sleep(0.01)  # polled: the server drops each as it closes

    async def _gather(self) -> None:
        faults = self.faults
        faults.held += 1
        faults.most_held = max(faults.most_held, faults.held)
        if faults.held >= faults.gather:
            self._gathered.set()
        with contextlib.suppress(TimeoutError):
            # Bounded: a hub that never has that many in flight fails its test, not hangs.
            await asyncio.wait_for(self._gathered.wait(), GATHER_S)
        faults.held -= 1

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        faults = self.faults
        faults.requests += 1
        is_object = request.method in ("GET", "HEAD") and "list-type" not in request.query \
            and request.path.count("/") >= 2
        if faults.slow_down > 0:
            faults.slow_down -= 1
            return web.Response(status=503, body=SLOW_DOWN, content_type="application/xml")
        if is_object and request.transport is not None:
            faults.peers.add(request.transport.get_extra_info("peername"))
        if is_object and request.method == "GET":
            faults.gets[request.path] += 1
            faults.pins.append((request.headers.get("If-Match"), request.query.get("versionId")))
            faults.presigned += "X-Amz-Signature" in request.query
            if faults.hold_s:
                await asyncio.sleep(faults.hold_s)  # a slow store, not a wait in a test
            if faults.gather:
                await self._gather()
            hook, faults.before_get = faults.before_get, None
            if hook is not None:
                await hook()
        elif is_object:
            faults.heads[request.path] += 1
        assert self._session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=await request.read() or None, allow_redirects=False,
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() in _HOP or (faults.strip_etag and name.lower() == "etag"):
                    continue
                response.headers.add(name, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            cut = faults.cut_after if is_object and request.method == "GET" else None
            if cut is not None:
                faults.cut_after = None
            sent = 0
            async for block in upstream.content.iter_chunked(64 << 10):
                if cut is not None and sent + len(block) > cut:
                    await response.write(block[: cut - sent])
                    assert request.transport is not None
                    request.transport.abort()  # a reset mid-body
                    return response
                await response.write(block)
                sent += len(block)
            await response.write_eof()
            return response
