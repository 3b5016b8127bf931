"""Per-client limits: a cap on requests in flight from one client address.

One client (a loader gone wrong, or a hostile one) must not take every handler slot
from the others. Requests over the cap get ``429`` problem+json with ``Retry-After``
and are counted in ``/metrics``. The address is the TCP peer's: headers such as
``X-Forwarded-For`` are the client's own words and are not trusted.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from service import logs
from service.cli import add_flag
from service.metrics import Series
from service.problem import Handler, problem_response

# Far above what a healthy client needs (a spoke keeps 2 x --fetch-concurrency
# connections to its hub; a host of 64 loader workers a few requests each), low
# enough that one client cannot tie up a server's memory and file descriptors.
DEFAULT_MAX_INFLIGHT_PER_CLIENT = 1024


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


def install(app: web.Application, max_inflight_per_client: int) -> None:
    """Cap requests in flight per client on ``app`` (0: no cap).

    Goes right after the access log, so refusals are logged and cost nothing more.
    """
    if max_inflight_per_client <= 0:
        return
    limit = InflightLimit(max_inflight_per_client)
    app[LIMIT] = limit
    after = app.middlewares.index(logs.access_log_middleware) + 1 \
        if logs.access_log_middleware in app.middlewares else 0
    app.middlewares.insert(after, middleware(limit))


def app_series(app: web.Application, prefix: str) -> list[Series]:
    """The ``/metrics`` series of ``app``'s limits; none when they are off."""
    limit = app.get(LIMIT)
    return limit.series(prefix) if limit is not None else []


def add_limit_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_flag(parser, "--max-inflight-per-client", env=env, type=int,
             default=DEFAULT_MAX_INFLIGHT_PER_CLIENT,
             help="requests in flight from one client address before 429 (0: no cap)")
