"""Per-client limits: requests in flight, open connections, and the header-read and
keep-alive timeouts.

One client (a loader gone wrong, or a hostile one) must not take every handler slot,
socket or file descriptor from the others.

- Requests in flight (``--max-inflight-per-client``): an aiohttp middleware; requests
  over the cap get ``429`` problem+json with ``Retry-After``.
- Open connections (``--max-connections-per-client``): a new connection over the cap
  closes that client's idlest connection (idle between requests, the least recently
  active), so a client's idle pool never locks out its own, or its neighbours', next
  connection. Only when none is idle is the new one closed, right after accept.
- Header timeout (``--header-timeout``, against slowloris): a connection must deliver
  a request's complete headers within that many seconds, counted from accept, or on a
  kept-alive connection from the first byte of the next request; else it is closed.
- Keep-alive timeout (``--keepalive-timeout``): a connection idle between requests
  for that long is closed. It exceeds the idle time clients keep pooled connections
  (the spoke's own hub client: 60 s), so a client, not the server, closes first and
  seldom sends a request into a connection being closed.

The connection limits live in the connection protocol (:class:`LimitedRequestHandler`,
and the fast path's), which :func:`make_runner` puts under the app. Every refusal and
every closing is counted in ``/metrics``. The address is the TCP peer's: headers such
as ``X-Forwarded-For`` are the client's own words and are not trusted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.typedefs import Middleware
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from service import logs
from service.cli import positive
from service.fast import FAST, FastHandler, FastServer, Tracked, has_unread_bytes
from service.front import FRONT, FrontRequestHandler, FrontStats, answering_in_http11
from service.metrics import Series
from service.problem import Handler, problem_response
from service.settings import setting, settings

# Far above what a healthy client needs (a spoke keeps 2 x --fetch-concurrency
# connections to its hub; a host of 64 loader workers a few requests each), low
# enough that one client cannot tie up a server's memory and file descriptors.
DEFAULT_MAX_INFLIGHT_PER_CLIENT = 1024
# A host of loader workers each with a client pool (aiohttp's default: 100) fits;
# one address holding thousands of sockets does not.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256
# A real client sends its headers in one go, a slow link within a few RTTs.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# nginx's default, above the 60 s a client pool such as the spoke's keeps idle
# connections: well under aiohttp's own 3,630 s, which let a client's idle pool hold its
# connection slots for an hour.
DEFAULT_KEEPALIVE_TIMEOUT_S = 75.0

logger = logging.getLogger(__name__)


@dataclass
class InflightLimit:
    """Counts requests in flight per client address; refuses those over ``max_per_client``."""

    max_per_client: int
    rejected: int = 0
    _inflight: dict[str, int] = field(default_factory=dict)

    def acquire(self, client: str) -> bool:
        """Take a slot for ``client``; False (and counted) when it has none left."""
        current = self._inflight.get(client, 0)
        if current >= self.max_per_client:
            self.rejected += 1
            return False
        self._inflight[client] = current + 1
        return True

    def release(self, client: str) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        left = self._inflight[client] - 1
        if left:
            self._inflight[client] = left
        else:
            del self._inflight[client]  # keep the map as small as the set of active clients

    def in_flight(self) -> int:
        """Requests in flight now, from all clients."""
        return sum(self._inflight.values())

    def series(self, prefix: str) -> list[Series]:
        return [
            Series(f"{prefix}_limit_inflight_rejected_total", "counter",
                   "requests refused 429: too many in flight from one client address",
                   lambda: self.rejected),
            Series(f"{prefix}_limit_inflight_clients", "gauge",
                   "client addresses with requests in flight", lambda: len(self._inflight)),
        ]


LIMIT = web.AppKey("inflight_limit", InflightLimit)


def middleware(limit: InflightLimit) -> Middleware:
    @web.middleware
    async def limit_inflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        client = request.remote or "-"
        if not limit.acquire(client):
            return problem_response(
                429, "Too Many Requests",
                f"more than {limit.max_per_client} requests in flight from this address",
                {"Retry-After": "1"},
            )
        try:
            return await handler(request)
        finally:
            limit.release(client)

    return limit_inflight


@dataclass
class ConnectionLimits:
    """Open connections per client address, and the header-read timeout (0: off)."""

    max_per_client: int
    header_timeout_s: float
    refused: int = 0
    idle_closed: int = 0
    header_timeouts: int = 0
    keepalive_timeouts: int = 0
    _open: dict[str, dict[Tracked, None]] = field(default_factory=dict)
    _open_total: int = 0

    def open(self, client: str, conn: Tracked) -> bool:
        """Count ``conn``, new from ``client``; at the cap, closes the client's idlest
        connection for it. False (and counted) when over the cap with none idle."""
        conns = self._open.setdefault(client, {})
        if 0 < self.max_per_client <= len(conns) and not self._close_idlest(conns):
            self.refused += 1
            return False
        conns[conn] = None
        self._open_total += 1
        return True

    def close(self, client: str, conn: Tracked) -> None:
        """``conn``, counted by :meth:`open`, is gone (a no-op if it was closed for room)."""
        conns = self._open.get(client)
        if conns is None or conn not in conns:
            return  # closed to make room for another: no longer counted
        del conns[conn]
        self._open_total -= 1
        if not conns:
            del self._open[client]  # keep the map as small as the set of connected clients

    def moved(self, client: str, old: Tracked, new: Tracked) -> None:
        """``old``'s connection goes on as ``new`` (another protocol took it over)."""
        conns = self._open[client]
        del conns[old]
        conns[new] = None

    def _close_idlest(self, conns: dict[Tracked, None]) -> bool:
        idle = [(at, i, conn) for i, conn in enumerate(conns) if (at := conn.idle_at()) is not None]
        if not idle:
            return False
        _, _, idlest = min(idle)
        del conns[idlest]  # its slot is the new one's now, whenever it finishes closing
        self._open_total -= 1
        self.idle_closed += 1
        idlest.close_idle()
        return True

    def series(self, prefix: str) -> list[Series]:
        return [
            Series(f"{prefix}_limit_connections_refused_total", "counter",
                   "connections closed at accept: one client address had "
                   "--max-connections-per-client open, none of them idle",
                   lambda: self.refused),
            Series(f"{prefix}_limit_connections_idle_closed_total", "counter",
                   "idle connections closed for a new one from the same client address, "
                   "at --max-connections-per-client", lambda: self.idle_closed),
            Series(f"{prefix}_limit_connections_open", "gauge",
                   "client connections open", lambda: self._open_total),
            Series(f"{prefix}_limit_header_timeouts_total", "counter",
                   "connections closed: request headers not complete within --header-timeout",
                   lambda: self.header_timeouts),
            Series(f"{prefix}_limit_keepalive_timeouts_total", "counter",
                   "connections closed: idle between requests for --keepalive-timeout",
                   lambda: self.keepalive_timeouts),
        ]


CONNECTIONS = web.AppKey("connection_limits", ConnectionLimits)
KEEPALIVE = web.AppKey("keepalive_timeout_s", float)


class LimitedRequestHandler(FrontRequestHandler):
    """aiohttp's connection protocol behind the front door, plus the per-client
    connection cap, the header timeout and the count of keep-alive timeouts
    (aiohttp's own timer closes those).

    Reads private attributes of ``RequestHandler`` (``_request_count``, ``_messages``,
    ``_upgraded``, ``_current_request``) and wraps ``_process_keepalive`` (checked against
    aiohttp 3.14) because aiohttp has no public hook for "a request's headers are parsed"
    or "an idle connection timed out"; tests/security/test_limits.py pins the behaviour.
    """

    __slots__ = ("_answered", "_client", "_header_timer", "_last_active", "_last_chunked",
                 "_last_payload", "_limits", "_reading_head", "_tail")

    def __init__(
        self, manager: web.Server, limits: ConnectionLimits, front: FrontStats, **kwargs: Any
    ) -> None:
        super().__init__(manager, front, **kwargs)
        self._limits = limits
        self._client: str | None = None  # set while the connection is counted
        self._header_timer: asyncio.TimerHandle | None = None
        self._last_payload: StreamReader | None = None  # body of the newest request
        self._last_chunked = False  # whether that body is chunked (its wire size unknown)
        self._reading_head = False  # part of a request's head is in, not all of it
        self._answered = 0  # requests whose answer is written
        self._last_active = time.monotonic()
        self._tail = b""  # the last bytes read, where a head's end may start

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple | list) and peer else "-"
        if not self._limits.open(client, self):
            transport.close()  # before aiohttp sees it: nothing read, nothing registered
            return
        self._client = client
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._client is None:
            return  # refused at accept
        self._limits.close(self._client, self)
        self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        parsed, body, was_reading = self._request_count, self._last_payload, self._reading_head
        body_done = body is None or body.is_eof()
        body_had = 0 if body is None else body.total_bytes
        super().data_received(data)
        if self.transport is None or not data:
            return
        self._last_active = time.monotonic()
        if self._request_count != parsed:  # a request's headers are complete
            self._disarm()
            self._last_payload = self._messages[-1][1] if self._messages else None
            message = self._messages[-1][0] if self._messages else None
            self._last_chunked = getattr(message, "chunked", True)
            self._reading_head = not self._upgraded and self._next_head_started(
                data, self._request_count - parsed == 1 and body_done, was_reading)
        elif self._upgraded:
            self._reading_head = False  # no more HTTP requests on this connection
        elif body_done:
            self._reading_head = True  # not body bytes: the start (or more) of a head
        elif body is not None and body.is_eof() and not self._last_chunked:
            # The body ended in this read: whatever came after it starts the next head.
            self._reading_head = len(data) > body.total_bytes - body_had
        self._tail = data[-3:]
        if self._reading_head:
            self._arm()

    def _next_head_started(self, data: bytes, only_head_here: bool, was_reading: bool) -> bool:
        """Whether bytes of another request's head follow the request just parsed from
        ``data``: ``only_head_here``, ``data`` holds nothing before that request's head
        but its start; ``was_reading``, the head began in an earlier read."""
        payload = self._last_payload
        if payload is EMPTY_PAYLOAD:
            return not data.endswith(b"\r\n\r\n")
        if payload is None or not payload.is_eof() or self._last_chunked or not only_head_here:
            return False  # body bytes still to come, or where it ends is unknown here
        before = self._tail if was_reading else b""
        found = (before + data).find(b"\r\n\r\n")
        if found < 0:
            return False  # a head ended some other way (bare LFs): its length is unknown
        return len(data) > found + 4 - len(before) + payload.total_bytes

    def adopt(self, transport: asyncio.Transport, client: str) -> None:
        """Take over a connection the fast path accepted and counted for ``client``."""
        self._client = client
        super().connection_made(transport)
        self._arm()

    # -- for the connection limits --------------------------------------------

    def idle_at(self) -> float | None:
        transport = self.transport
        body = self._last_payload
        if transport is None or self._reading_head or self._messages or self._upgraded \
                or self._answered != self._request_count \
                or (body is not None and not body.is_eof()) or transport.get_write_buffer_size() \
                or has_unread_bytes(transport):
            return None
        return self._last_active

    def close_idle(self) -> None:
        self.force_close()

    def log_access(
        self, request: BaseRequest, response: StreamResponse, time_s: float | None
    ) -> None:
        """Called by aiohttp once an answer is written: the connection may be idle now."""
        self._answered += 1
        self._last_active = time.monotonic()
        super().log_access(request, response, time_s)

    def _process_keepalive(self) -> None:
        was_open = self.transport is not None
        super()._process_keepalive()
        if was_open and self.transport is None:
            self._limits.keepalive_timeouts += 1

    # -- header timer -----------------------------------------------------------

    def _arm(self) -> None:
        if self._header_timer is None and self._limits.header_timeout_s > 0:
            self._header_timer = self._loop.call_later(
                self._limits.header_timeout_s, self._headers_timed_out
            )

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport is None:
            return
        if self._messages or self._current_request is not None:
            # A complete request waits for, or is being answered by, the server: not the
            # client's delay. (Armed for the start of the next request, which came in the
            # same read, the timer must not cut the answer in flight.)
            self._arm()
            return
        self._limits.header_timeouts += 1
        logger.debug("closing a connection from %s: no complete request headers in %.3g s",
                     self._client, self._limits.header_timeout_s)
        self.force_close()


class _LimitedServer(web.Server):
    """The app's low-level server: fast-path connections when the app has a fast
    handler, else (and for what the fast path declines) :class:`LimitedRequestHandler`."""

    def __init__(
        self, plain: web.Server, limits: ConnectionLimits, fast_handler: FastHandler | None,
        front: FrontStats,
    ) -> None:
        super().__init__(
            plain.request_handler, request_factory=answering_in_http11(plain.request_factory),
            handler_cancellation=plain.handler_cancellation, loop=plain._loop, **plain._kwargs,
        )
        self._limits = limits
        self._front = front
        self._fast = None if fast_handler is None else FastServer(
            fast_handler, self._slow, limits,
            idle_timeout_s=float(
                self._kwargs.get("keepalive_timeout", DEFAULT_KEEPALIVE_TIMEOUT_S)),
            front=front,
        )

    def _slow(self) -> LimitedRequestHandler:
        return LimitedRequestHandler(
            self, self._limits, self._front, loop=self._loop, **self._kwargs
        )

    # The loop's protocol factory: any asyncio.Protocol will do, not only aiohttp's.
    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        return self._slow() if self._fast is None else self._fast()

    def taking_over(self, received: bytes) -> asyncio.Protocol:
        """The protocol of a connection accepted by another process, which had read
        ``received`` of it: the fast path answers those bytes first."""
        if self._fast is None:
            raise RuntimeError("only a server with a fast handler takes connections over")
        return self._fast(received)

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        if self._fast is not None:
            await self._fast.shutdown(timeout if timeout is not None else 5.0)
        await super().shutdown(timeout)


class _LimitedAppRunner(web.AppRunner):
    __slots__ = ("_limits",)

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        return _LimitedServer(
            await super()._make_server(), self._limits, self.app.get(FAST),
            self.app.get(FRONT) or FrontStats(),
        )


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """``web.AppRunner(app, **kwargs)`` behind the front door (:mod:`service.front`),
    enforcing the connection limits and keep-alive timeout installed on ``app`` and
    answering through its fast handler (:data:`service.fast.FAST`) if it has one."""
    kwargs.setdefault("keepalive_timeout", app.get(KEEPALIVE, DEFAULT_KEEPALIVE_TIMEOUT_S))
    return _LimitedAppRunner(app, app.get(CONNECTIONS) or ConnectionLimits(0, 0.0), **kwargs)


def install(
    app: web.Application,
    max_inflight_per_client: int,
    *,
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S,
) -> None:
    """Put the per-client limits (each 0: off) and the keep-alive timeout on ``app``.

    The in-flight cap goes right after the access log, so refusals are logged and cost
    nothing more; the connection limits take effect through :func:`make_runner`.
    """
    app[KEEPALIVE] = keepalive_timeout_s
    if max_connections_per_client > 0 or header_timeout_s > 0:
        app[CONNECTIONS] = ConnectionLimits(
            max(0, max_connections_per_client), max(0.0, header_timeout_s)
        )
    if max_inflight_per_client <= 0:
        return
    limit = InflightLimit(max_inflight_per_client)
    app[LIMIT] = limit
    after = app.middlewares.index(logs.access_log_middleware) + 1 \
        if logs.access_log_middleware in app.middlewares else 0
    app.middlewares.insert(after, middleware(limit))


def app_series(app: web.Application, prefix: str) -> list[Series]:
    """The ``/metrics`` series of ``app``'s limits; none when they are off."""
    limit, connections = app.get(LIMIT), app.get(CONNECTIONS)
    return [*(limit.series(prefix) if limit is not None else []),
            *(connections.series(prefix) if connections is not None else [])]


@settings
class LimitSettings:
    """Per-client limits (both servers take these)."""

    max_inflight_per_client: int = setting(
        "--max-inflight-per-client", default=DEFAULT_MAX_INFLIGHT_PER_CLIENT, parse=int,
        help="requests in flight from one client address before 429 (0: no cap)")
    max_connections_per_client: int = setting(
        "--max-connections-per-client", default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT, parse=int,
        help="open connections from one client address; a new one over the cap closes "
             "that client's idlest connection, or is closed at accept when none is idle "
             "(0: no cap)")
    header_timeout_s: float = setting(
        "--header-timeout", default=DEFAULT_HEADER_TIMEOUT_S, parse=float,
        help="seconds a connection has to send a request's complete headers, against "
             "slowloris (0: no timeout)")
    keepalive_timeout_s: float = setting(
        "--keepalive-timeout", default=DEFAULT_KEEPALIVE_TIMEOUT_S, parse=positive(float),
        help="seconds a connection may stay idle between requests before it is closed")
