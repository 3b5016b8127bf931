"""A spoke's chunk fill from an object store, answered on the fast path (no aiohttp).

The hot path of a hub over a store is one request: ``GET /objects/{path}`` of one
``bytes=a-b`` range with ``If-Match`` naming the version. Through aiohttp it costs its
request machinery and three trips from the loop to a thread and back (the store's GET,
the relay, the close), each a wait for a core on a busy machine. Here, from a store
over plain HTTP, it takes no trip at all: the loop sends the presigned GET on a
connection of its own, plans the answer from the store's (as the aiohttp handler plans
it) and splices the body from the store's socket to the client's
(:func:`hub.relay.relay_in_loop`). From any other store (TLS, a proxy: botocore's
connections) it is one trip: one store thread does the same (:func:`fill_blocking`).

The rules are the handler's: the store's answer must be the range of the version asked
for (ETag and Content-Range checked, If-Match sent), and the head goes only with the
body's first bytes. Whatever else happens before then (a 412, a 404, a throttle, a store
unreachable, a body failing before its first byte) is declined with nothing sent, and
aiohttp answers the request from the start, its retries and problem answers included.
A body cut after the head is a cut answer, never a padded one. A fill made before the
spoke has the manifest names no version: it is pinned to the one a HEAD finds, as the
handler pins it.

A spoke's chunk connections carry fills only (spoke.upstream.hub), so they stay on this
path; a connection that carries anything else goes to aiohttp for good (service.fast).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from aiohttp import web

from hub.backend import ObjectInfo
from hub.fast import (
    OBJECTS,
    PLANNED_FIELDS,
    FastFront,
    head_fields,
    representation_of,
    thread_answer,
)
from hub.relay import NotSent, StoreCut, relay_blocking, relay_in_loop
from hub.stats import HubStats
from protocol.errors import ProtocolError
from protocol.http1 import Headers, RequestHead
from protocol.response import plan_response
from service.fast import FastConnection, Reply

if TYPE_CHECKING:  # botocore is imported only by a hub that serves a store
    from hub.store.plain import LoopAnswer, LoopGets
    from hub.store.s3 import S3Object


@runtime_checkable
class FillStore(Protocol):
    """A backend that opens a spoke's chunk fill with one request (an object store's,
    :class:`hub.store.s3.S3Backend`)."""

    @property
    def executor(self) -> ThreadPoolExecutor: ...

    def stat(self, path: str) -> ObjectInfo: ...

    def open_fill(
        self, path: str, if_match: str | None, range_value: str | None
    ) -> S3Object | None: ...

    def close_connections(self) -> None: ...

    @property
    def loop_gets(self) -> LoopGets | None:
        """The store's connections for GETs from the event loop; None: from a thread."""
        ...

    async def loop_get(
        self, path: str, etag: str, range_value: str
    ) -> tuple[LoopAnswer, ObjectInfo, tuple[int, int]] | None: ...


@dataclass(frozen=True, slots=True)
class Fill:
    """One chunk fill as the loop hands it to a store thread."""

    path: str
    if_match: str | None  # None: a fill made before the manifest, of the current version
    range_value: str
    headers: Headers  # the request's fields (never changed once read)
    head_end: str  # the connection's fields that end every head (Date, request id...)


class FastStoreFills(FastFront):
    """The hub app's :data:`service.fast.FastHandler` over an object store: chunk fills."""

    def __init__(self, app: web.Application, backend: FillStore, stats: HubStats) -> None:
        super().__init__(app, stats)
        self.backend = backend
        # A store the loop reaches itself (plain HTTP) is read from the loop; any other
        # from a store thread.
        self._answer = self._fill if backend.loop_gets is None else self._fill_in_loop
        app.on_cleanup.append(self._close_connections)

    async def _close_connections(self, _app: web.Application) -> None:
        self.backend.close_connections()

    def __call__(self, head: RequestHead, conn: FastConnection) -> Awaitable[Reply | None] | None:
        fields = head.headers
        if head.method != "GET" or not head.target.startswith(OBJECTS) \
                or "range" not in fields \
                or not PLANNED_FIELDS.issuperset(fields):
            return None
        path = self._admit(head, conn)
        if path is None:
            return None
        sock_fd = conn.socket_copy()
        if sock_fd is None:  # TLS, or bytes still queued: aiohttp's way
            self._release(conn)
            return None
        fill = Fill(path, fields.get("if-match"), fields["range"], fields,
                    conn.head_end(head.keep_alive))
        return self._finish(self._answer(fill, sock_fd, conn), conn)

    async def _fill_in_loop(self, fill: Fill, sock_fd: int, conn: FastConnection
                            ) -> Reply | None:
        try:
            sent = await self._relayed(fill, sock_fd)
        except StoreCut as exc:
            conn.abort()  # the head went: cut the answer, never pad it
            sent = exc.sent
        finally:
            os.close(sock_fd)
        if sent is None:
            return None  # nothing sent: aiohttp answers it
        self.stats.requests += 1
        self.stats.bytes_sent += sent
        return Reply(206, sent)

    async def _relayed(self, fill: Fill, sock_fd: int) -> int | None:
        """The body bytes :func:`relay_in_loop` sent; None when nothing was."""
        backend = self.backend
        etag = fill.if_match
        if etag is None:
            # As fill_blocking: the current version, by a HEAD, pins the GET.
            try:
                info = await asyncio.get_running_loop().run_in_executor(
                    backend.executor, backend.stat, fill.path)
            except ProtocolError:
                return None
            etag = info.etag
        got = await backend.loop_get(fill.path, etag, fill.range_value)
        if got is None:
            return None
        answer, info, span = got
        whole = False
        try:
            head = fill_head(fill, info, span)
            if head is None:
                return None
            sent = await relay_in_loop(sock_fd, answer.sock.fileno(), answer.ahead,
                                       span[1] - span[0], head, answer.gets.timeout_s)
            whole = True
            return sent
        except NotSent:
            return None
        finally:
            answer.finish(whole)

    async def _fill(self, fill: Fill, sock_fd: int, conn: FastConnection) -> Reply | None:
        stop = threading.Event()
        job = self.backend.executor.submit(fill_blocking, self.backend, fill, sock_fd, stop)
        try:
            # A fill the thread sent at all, it sent whole (a cut one raises).
            sent = await thread_answer(job, stop, lambda: os.close(sock_fd),
                                       lambda n: n is not None)
        except (StoreCut, ProtocolError) as exc:
            conn.abort()  # the head went: cut the answer, never pad it
            sent = exc.sent if isinstance(exc, StoreCut) else 0
            self.stats.requests += 1
            self.stats.bytes_sent += sent
            return Reply(206, sent)
        finally:
            stop.set()  # cancelled (the client went away): the thread stops too
        if sent is None:
            return None  # nothing sent: aiohttp answers it
        self.stats.requests += 1
        self.stats.bytes_sent += sent
        return Reply(206, sent)


def fill_blocking(backend: FillStore, fill: Fill, sock_fd: int, stop: threading.Event
                  ) -> int | None:
    """Answer ``fill`` on ``sock_fd`` (owned: closed here); the body bytes sent, or None
    when nothing was (declined: not the range of the version asked for, or the store
    failed before its body's first byte)."""
    owned = True
    try:
        etag = fill.if_match
        if etag is None:
            # A spoke's fill made before it has the manifest (spoke.cache.early) names
            # no version: the current one, by a HEAD, is the one its GET is pinned to.
            try:
                etag = backend.stat(fill.path).etag
            except ProtocolError:
                return None  # a 404, a store unavailable: aiohttp's answer
        obj = backend.open_fill(fill.path, etag, fill.range_value)
        if obj is None:
            return None
        try:
            span = obj.span
            head = None if span is None else fill_head(fill, obj.info, span)
            if span is None or head is None:
                return None
            owned = False  # the relay closes it
            try:
                return relay_blocking(sock_fd, obj, span[0], span[1] - span[0], stop, head)
            except NotSent:
                return None
        finally:
            obj.close()
    finally:
        if owned:
            os.close(sock_fd)


def fill_head(fill: Fill, info: ObjectInfo, span: tuple[int, int]) -> bytes | None:
    """The head of the answer to ``fill`` from a store's answer of ``span`` of the
    version ``info``, planned as the aiohttp handler plans it; None unless that answer
    is a 206 of that one span (a 412: another version; a 416)."""
    try:
        plan = plan_response("GET", fill.headers, representation_of(info), "", int(time.time()))
    except ProtocolError:
        return None
    if plan.status != 206 or plan.boundary is not None \
            or [(r.start, r.stop) for r in plan.ranges] != [span]:
        return None
    lines = ["HTTP/1.1 206 Partial Content",
             *(f"{name}: {value}" for name, value in head_fields(plan)), fill.head_end]
    return "\r\n".join(lines).encode("latin-1")
