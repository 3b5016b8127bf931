"""Logging: plain or JSON lines, and one access-log line per request.

Every request gets an id (the client's ``X-Request-Id`` if it sent a sane one,
else a fresh one), echoed in the response and kept in a context variable so the
spoke forwards it on the hub fetches that request causes: one id ties a loader's
read to the hub's log lines.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import re
import secrets
import sys
import time
from collections.abc import Callable

from aiohttp import web

from protocol.headers import CACHE_HEADER, REQUEST_ID_HEADER, SERVER
from service.access_buffer import AccessBuffer, OrderedStreamHandler, start_buffer
from service.problem import Handler

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
access_logger = logging.getLogger("hubspoke.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any ``extra`` fields."""

    _STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in self._STANDARD})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class RateLimitedLog:
    """At most one line per ``interval_s`` for each key, the next one saying how many
    were held back: for what anonymous input can trigger, so that a flood of it
    costs a line a minute, not a line (or a traceback) a request. Keys must come from
    a small, fixed set (a status, a kind), never from the input."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def log(self, level: int, key: object, msg: str, *args: object,
            first_exc: BaseException | None = None) -> bool:
        """Log ``msg % args`` unless ``key`` had a line less than ``interval_s`` ago;
        whether it was logged. ``first_exc``'s traceback goes with the key's first line
        only: it shows where, and the later ones would only repeat it."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg, args = msg + " (and %d more like it since the last such line)", (*args, held)
        self.logger.log(level, msg, *args, exc_info=first_exc if last is None else None)
        return True


def setup_logging(level: str, fmt: str = "text") -> None:
    global _buffer
    _buffer = None  # the access lines go through ``logging`` until buffer_access_log
    handler = OrderedStreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


# Set by buffer_access_log: the access lines go there instead of through ``logging``.
_buffer: AccessBuffer | None = None


def buffer_access_log(fmt: str) -> None:
    """Write the access lines in batches (:mod:`service.access_buffer`) through the handler
    :func:`setup_logging` installed, in its format ``fmt``; if the level leaves them out
    (``--log-level warning``), they stay out."""
    global _buffer
    handler = next((h for h in logging.getLogger().handlers
                    if isinstance(h, OrderedStreamHandler)), None)
    if handler is None or not access_logger.isEnabledFor(logging.INFO):
        return
    _buffer = start_buffer(handler, fmt)


REQUEST_ID_KEY = web.RequestKey("request_id", str)


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: every answer carries the request's id."""
    rid = request.get(REQUEST_ID_KEY)
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


async def add_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: hub and spoke name themselves alike (aiohttp would
    say its version, the fast path nothing)."""
    response.headers["Server"] = SERVER


def install(app: web.Application) -> None:
    """Give ``app`` request ids and the access log (call before other middlewares)."""
    app.middlewares.insert(0, access_log_middleware)
    app.on_response_prepare.append(add_request_id_header)
    app.on_response_prepare.append(add_server_header)


# A random per-process prefix and a counter: unique like random ids, without a
# getrandom() call per request (a measurable cost on the fast path).
_ID_PREFIX = secrets.token_hex(4)
_id_counter = itertools.count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFF:08x}"


def is_sane_id(value: str) -> bool:
    """Whether a client's ``X-Request-Id`` is fit to log and forward as is."""
    return _SANE_ID.fullmatch(value) is not None


def log_access(
    rid: str, method: str, path: str, status: int, remote: str | None, started: float,
    body_bytes: int, x_cache: str | None,
) -> None:
    """The access-log line of one answered request (``started``: a perf_counter reading;
    ``path``: a request target, its query left out here)."""
    buffer = _buffer
    if buffer is not None:
        buffer.add(rid, method, path, status, remote, started, body_bytes, x_cache)
        return
    if access_logger.isEnabledFor(logging.INFO):
        path = path.partition("?")[0]
        access_logger.info(
            "%s %s %d", method, path, status,
            extra={
                "request_id": rid, "method": method, "path": path, "status": status,
                "remote": remote, "duration_ms": round(1000 * (time.perf_counter() - started), 3),
                "bytes": body_bytes, "x_cache": x_cache,
            },
        )


@web.middleware
async def access_log_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming = request.headers.get(REQUEST_ID_HEADER, "")
    rid = incoming if is_sane_id(incoming) else new_request_id()
    token = request_id.set(rid)
    request[REQUEST_ID_KEY] = rid
    started = time.perf_counter()
    status = 500
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        request_id.reset(token)
        log_access(
            rid, request.method, request.path, status, request.remote, started,
            response.body_length if response is not None else 0,
            response.headers.get(CACHE_HEADER) if response is not None else None,
        )
