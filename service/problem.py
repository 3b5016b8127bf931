"""problem+json (RFC 9457) errors, and the one middleware that produces them.

Handlers raise; this middleware translates. :class:`protocol.errors.ProtocolError`
subclasses carry their status, aiohttp's own HTTP exceptions (404 for an unknown
route, 405, 413) keep theirs, and anything unexpected is logged and answered 500
so a bug is visible instead of a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from protocol.errors import ProtocolError, RangeNotSatisfiable
from protocol.ranges import unsatisfied_content_range

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def problem_response(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    """A problem+json response with ``status``, ``title`` and ``detail``."""
    return web.Response(
        status=status, text=problem_body(status, title, detail).decode(), content_type=PROBLEM_JSON,
        headers=headers or {},
    )


def problem_body(status: int, title: str, detail: str) -> bytes:
    """The RFC 9457 document itself, for servers that frame their own responses."""
    return json.dumps(
        {"type": "about:blank", "status": status, "title": title, "detail": detail}
    ).encode()


def error_headers(exc: ProtocolError) -> dict[str, str]:
    """Headers an error adds to its answer (416's Content-Range, 503's Retry-After)."""
    headers: dict[str, str] = {}
    if isinstance(exc, RangeNotSatisfiable):
        headers["Content-Range"] = unsatisfied_content_range(exc.size)
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    return headers


async def expect_handler(request: web.Request) -> None:
    """``Expect:`` handling for every route: aiohttp's default echoes the header into
    a plain-text 417, and fails with a 500 when that value is not valid UTF-8."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the answer's body
        return
    raise web.HTTPExpectationFailed(text="only Expect: 100-continue is supported")


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProtocolError as exc:
        return problem_response(exc.status_hint, exc.title, str(exc), error_headers(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return problem_response(exc.status, exc.reason, exc.text or exc.reason, headers)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except (HttpProcessingError, RequestPayloadError) as exc:
        # A body that does not decode as its Content-Encoding says, or is cut short.
        code = getattr(exc, "code", 400)
        status = code if isinstance(code, int) and 400 <= code < 500 else 400
        return problem_response(status, "Bad Request", f"unreadable request body: {exc}"[:300])
    except Exception:
        logger.exception("unhandled error serving %s %s", request.method, request.path)
        return problem_response(500, "Internal Server Error", "unexpected server error")
