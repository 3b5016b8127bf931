"""The front door: what happens to a request on its way to aiohttp, on both servers.

aiohttp's parser reads every request on a connection (on the spoke, every one the
fast path leaves to it). In front of it, :class:`protocol.http1.RequestScreen`
refuses unknown methods (501), HTTP versions other than 1.x (505) and garbage (400,
as soon as it arrives), and drops what follows a request that closes the
connection (RFC 9112 §9.6). A refused request, whether the screen or aiohttp's
parser refuses it, is answered in turn, after the requests before it, with
problem+json and an HTTP/1.1 status line, and the connection closes.

The answer never quotes the request, and neither does the log: a header line may
hold a bearer token, whatever else is wrong with it. A refusal costs one
rate-limited log line, not a traceback, and a client that goes away mid-request is
counted, not logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    LineTooLong,
    PayloadEncodingError,
)
from aiohttp.web_protocol import ERROR, RequestHandler

from protocol.errors import ProtocolError
from protocol.http1 import RequestScreen
from service.logs import RateLimitedLog
from service.metrics import Series
from service.problem import problem_response

logger = logging.getLogger(__name__)


# The answer to a refused request (status, title, detail): problem+json unless the
# server speaks another dialect (the spoke's S3 front end answers S3's XML).
Renderer = Callable[[int, str, str], web.Response]


@dataclass
class FrontStats:
    """What the front door turned away, for ``/metrics``; and its rate-limited log."""

    refused: int = 0
    hangups: int = 0
    log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(logger))
    render: Renderer = problem_response

    def series(self, prefix: str) -> list[Series]:
        return [
            Series(f"{prefix}_requests_refused_total", "counter",
                   "requests refused before routing: malformed, an unknown method, "
                   "an HTTP version other than 1.x", lambda: self.refused),
            Series(f"{prefix}_client_hangups_total", "counter",
                   "requests whose client went away before their answer was complete",
                   lambda: self.hangups),
        ]

    def hung_up(self, client: str | None) -> None:
        self.hangups += 1
        logger.debug("%s went away mid-request", client)


FRONT = web.AppKey("front_stats", FrontStats)


def install(app: web.Application) -> None:
    """Count (and log) what the front door of ``app``'s server turns away."""
    app[FRONT] = FrontStats()


def app_series(app: web.Application, prefix: str) -> list[Series]:
    stats = app.get(FRONT)
    return stats.series(prefix) if stats is not None else []


class Refused(HttpProcessingError):
    """A request the screen refused, raised from aiohttp's parser so that aiohttp
    answers it in its turn, after the requests before it."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(code=error.status_hint, message=error.title)
        self.error = error


# What aiohttp's parse errors are answered with, by kind (the first that matches):
# never the parser's own message, which quotes the offending line.
_PARSE_ERRORS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, "a request line or header field is too long"),
    (BadHttpMethod, "the request does not start with a method"),
    (BadStatusLine, "the request line is malformed"),
    (PayloadEncodingError, "the request's content is not framed as its head says"),
)
_MALFORMED = "the request head is not valid HTTP/1.1"


def refusal(exc: BaseException | None, status: int) -> tuple[int, str, str]:
    """The status, title and detail of the answer to a request aiohttp could not
    hand to the app (``status``: aiohttp's choice)."""
    if isinstance(exc, Refused):
        return exc.error.status_hint, exc.error.title, str(exc.error)
    if isinstance(exc, HttpProcessingError):
        detail = next((text for kind, text in _PARSE_ERRORS if isinstance(exc, kind)), _MALFORMED)
        status = exc.code if 400 <= exc.code < 500 else 400
        return status, HTTPStatus(status).phrase, detail
    return status, HTTPStatus(status).phrase, "unexpected server error"


class _ScreenedParser:
    """aiohttp's request parser, fed through a :class:`RequestScreen`. The error the
    screen finds is raised from here once the parser has given up every message
    before it."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        self._screen = RequestScreen()
        self.refused: ProtocolError | None = None  # found, not raised yet

    def feed_data(self, data: bytes) -> tuple[Any, bool, bytes]:
        passed, error = self._screen.receive(data) if data else (b"", None)
        if error is not None:
            self.refused = error
        result: tuple[Any, bool, bytes] = self._parser.feed_data(passed)
        if self.refused is not None and not result[0] and not result[1]:
            error, self.refused = self.refused, None
            raise Refused(error)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class FrontRequestHandler(RequestHandler):
    """aiohttp's connection protocol behind the screen, answering every refusal as
    problem+json. Replaces the private ``_parser`` of ``RequestHandler`` (checked
    against aiohttp 3.14; tests/integration/test_front_door.py pins the behaviour)."""

    __slots__ = ("_front", "_screened")

    def __init__(self, manager: web.Server, front: FrontStats, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._front = front
        self._screened = _ScreenedParser(self._parser)
        self._parser = self._screened  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._screened.refused is not None and not self._buffer_paused:
            super().data_received(b"")  # the refusal's turn: it queues behind the rest

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, ConnectionError):
            self._front.hung_up(request.remote)
            raise ConnectionResetError("the client went away") from None  # aiohttp drops it
        if request.writer.output_size > 0:
            raise ConnectionError("an answer is under way: only a cut can tell the client")
        status, title, detail = refusal(exc, status)
        if isinstance(exc, HttpProcessingError):
            self._front.refused += 1
            self._front.log.log(logging.INFO, status, "refused a request from %s: %d %s (%s)",
                                request.remote, status, title, detail)
        else:
            logger.error("unhandled error answering %s", request.remote, exc_info=exc)
        response = self._front.render(status, title, detail)
        response.force_close()
        return response


# The request aiohttp makes up for a refused one, as HTTP/1.1: the refusal's status
# line then names the version we speak, not 1.0.
_REFUSED_HTTP11 = ERROR._replace(version=HttpVersion11)

RequestFactory = Callable[..., web.BaseRequest]


def answering_in_http11(factory: RequestFactory) -> RequestFactory:
    """``factory`` (a ``web.Server``'s ``request_factory``), with refusals answered in HTTP/1.1."""

    def make(message: Any, *args: Any) -> web.BaseRequest:
        return factory(_REFUSED_HTTP11 if message is ERROR else message, *args)

    return make
