"""Per-client limits: requests in flight, open connections, and a header-read timeout.

One client (a loader gone wrong, or a hostile one) must not take every handler slot,
socket or file descriptor from the others.

- Requests in flight (``--max-inflight-per-client``): an aiohttp middleware; requests
  over the cap get ``429`` problem+json with ``Retry-After``.
- Open connections (``--max-connections-per-client``): connections over the cap are
  closed right after accept, before a byte is read.
- Header timeout (``--header-timeout``, against slowloris): a connection must deliver
  a request's complete headers within that many seconds, counted from accept, or on a
  kept-alive connection from the first byte of the next request; else it is closed.
  An idle kept-alive connection is aiohttp's ``keepalive_timeout``'s business.

The last two live in the connection protocol (:class:`LimitedRequestHandler`), which
:func:`make_runner` puts under the app. Every refusal is counted in ``/metrics``. The
address is the TCP peer's: headers such as ``X-Forwarded-For`` are the client's own
words and are not trusted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.typedefs import Middleware

from service import logs
from service.cli import add_flag
from service.fast import FAST, FastHandler, FastServer
from service.front import FRONT, FrontRequestHandler, FrontStats, answering_in_http11
from service.metrics import Series
from service.problem import Handler, problem_response

# Far above what a healthy client needs (a spoke keeps 2 x --fetch-concurrency
# connections to its hub; a host of 64 loader workers a few requests each), low
# enough that one client cannot tie up a server's memory and file descriptors.
DEFAULT_MAX_INFLIGHT_PER_CLIENT = 1024
# A host of loader workers each with a client pool (aiohttp's default: 100) fits;
# one address holding thousands of sockets does not.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256
# A real client sends its headers in one go, a slow link within a few RTTs.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# aiohttp's own default idle timeout for kept-alive connections, kept for fast ones.
AIOHTTP_KEEPALIVE_S = 3630.0

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
    header_timeouts: int = 0
    _open: dict[str, int] = field(default_factory=dict)
    _open_total: int = 0

    def open(self, client: str) -> bool:
        """Count a new connection from ``client``; False (and counted) when over the cap."""
        current = self._open.get(client, 0)
        if self.max_per_client > 0 and current >= self.max_per_client:
            self.refused += 1
            return False
        self._open[client] = current + 1
        self._open_total += 1
        return True

    def close(self, client: str) -> None:
        """A connection counted by :meth:`open` is gone."""
        left = self._open[client] - 1
        if left:
            self._open[client] = left
        else:
            del self._open[client]
        self._open_total -= 1

    def series(self, prefix: str) -> list[Series]:
        return [
            Series(f"{prefix}_limit_connections_refused_total", "counter",
                   "connections closed at accept: too many open from one client address",
                   lambda: self.refused),
            Series(f"{prefix}_limit_connections_open", "gauge",
                   "client connections open", lambda: self._open_total),
            Series(f"{prefix}_limit_header_timeouts_total", "counter",
                   "connections closed: request headers not complete within --header-timeout",
                   lambda: self.header_timeouts),
        ]


CONNECTIONS = web.AppKey("connection_limits", ConnectionLimits)


class LimitedRequestHandler(FrontRequestHandler):
    """aiohttp's connection protocol, plus the per-client connection cap and header timeout.

    Reads four private attributes of ``RequestHandler`` (``_request_count``, ``_messages``,
    ``_upgraded``, ``_current_request``; checked against aiohttp 3.14) because aiohttp has
    no public hook for "a request's headers are parsed"; tests/security/test_limits.py pins
    the behaviour.
    """

    __slots__ = ("_client", "_header_timer", "_last_payload", "_limits")

    def __init__(
        self, manager: web.Server, limits: ConnectionLimits, front: FrontStats, **kwargs: Any
    ) -> None:
        super().__init__(manager, front, **kwargs)
        self._limits = limits
        self._client: str | None = None  # set while the connection is counted
        self._header_timer: asyncio.TimerHandle | None = None
        self._last_payload: StreamReader | None = None  # body of the newest request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple | list) and peer else "-"
        if not self._limits.open(client):
            transport.close()  # before aiohttp sees it: nothing read, nothing registered
            return
        self._client = client
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._client is None:
            return  # refused at accept
        self._limits.close(self._client)
        self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        super().data_received(data)
        if self.transport is None or not data or self._limits.header_timeout_s <= 0:
            return
        if self._request_count != parsed:  # a request's headers are complete
            self._disarm()
            self._last_payload = self._messages[-1][1] if self._messages else None
            if self._last_payload is EMPTY_PAYLOAD and not data.endswith(b"\r\n\r\n"):
                self._arm()  # the start of the next request came in the same read
        elif not self._upgraded and (
            self._last_payload is None or self._last_payload.is_eof()
        ):
            self._arm()  # not body bytes: the start (or more) of a request's headers

    def adopt(self, transport: asyncio.Transport, client: str) -> None:
        """Take over a connection the fast path accepted and counted for ``client``."""
        self._client = client
        super().connection_made(transport)
        self._arm()

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
            idle_timeout_s=float(self._kwargs.get("keepalive_timeout", AIOHTTP_KEEPALIVE_S)),
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
    enforcing the connection limits installed on ``app`` and answering through its
    fast handler (:data:`service.fast.FAST`) if it has one."""
    return _LimitedAppRunner(app, app.get(CONNECTIONS) or ConnectionLimits(0, 0.0), **kwargs)


def install(
    app: web.Application,
    max_inflight_per_client: int,
    *,
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
) -> None:
    """Put the per-client limits on ``app`` (each 0: off).

    The in-flight cap goes right after the access log, so refusals are logged and cost
    nothing more; the connection limits take effect through :func:`make_runner`.
    """
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


def add_limit_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_flag(parser, "--max-inflight-per-client", env=env, type=int,
             default=DEFAULT_MAX_INFLIGHT_PER_CLIENT,
             help="requests in flight from one client address before 429 (0: no cap)")
    add_flag(parser, "--max-connections-per-client", env=env, type=int,
             default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
             help="open connections from one client address; more are closed at accept "
                  "(0: no cap)")
    add_flag(parser, "--header-timeout", env=env, type=float, default=DEFAULT_HEADER_TIMEOUT_S,
             help="seconds a connection has to send a request's complete headers, against "
                  "slowloris (0: no timeout)")
