"""The S3 front end's one error middleware: every failure becomes S3's XML error.

Handlers raise the spoke's own errors (a missing object, the hub unreachable, a bad
range) or :mod:`protocol.s3.errors`; this maps them to S3's codes and statuses, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from protocol.conditional import PreconditionFailed
from protocol.errors import BadPath, ProtocolError, RangeNotSatisfiable
from protocol.headers import REQUEST_ID_HEADER
from protocol.s3 import xml
from protocol.s3.errors import S3Error
from protocol.s3.sigv4 import S3AuthError
from service.logs import REQUEST_ID_KEY, RateLimitedLog, new_request_id
from service.problem import PROBLEM_JSON, Handler, error_headers
from spoke.upstream.errors import GoneAtHub, HubError, ObjectChanging, StaleVersion

logger = logging.getLogger(__name__)
_unexpected = RateLimitedLog(logger)
AMZ_REQUEST_ID = "x-amz-request-id"
# The spoke's count of error answers by code (spoke.s3.stats), set by make_s3_app.
ERRORS = web.AppKey("s3_errors", Counter[str])


def s3_code(exc: ProtocolError) -> tuple[int, str]:
    """The status and S3 error code ``exc`` is answered with."""
    if isinstance(exc, S3Error | S3AuthError):
        return exc.status_hint, exc.code
    if isinstance(exc, RangeNotSatisfiable):
        return 416, "InvalidRange"
    if isinstance(exc, PreconditionFailed):
        return 412, "PreconditionFailed"
    if isinstance(exc, GoneAtHub):
        return 404, "NoSuchKey"
    if isinstance(exc, BadPath):
        return 400, "InvalidArgument"
    if isinstance(exc, StaleVersion | ObjectChanging):
        return 503, "SlowDown"
    if isinstance(exc, HubError) or exc.status_hint >= 500:
        # The hub is down, slow, or answered nonsense: a client should retry later.
        return 503, "ServiceUnavailable"
    if exc.status_hint in (401, 403):
        return 403, "AccessDenied"
    if exc.status_hint == 404:
        return 404, "NoSuchKey"
    if exc.status_hint == 429:
        return 503, "SlowDown"
    return 400, "InvalidRequest"


def error_response(
    request: web.Request, status: int, code: str, message: str,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """S3's XML error document for ``request``."""
    rid = request.get(REQUEST_ID_KEY, "-")
    errors = request.app.get(ERRORS)
    if errors is not None:
        errors[code] += 1
    body = xml.error(code, message, request.path, rid)
    out = dict(headers or {})
    if status == 503:
        out.setdefault("Retry-After", "1")
    return web.Response(status=status, body=body, content_type=xml.XML_TYPE,
                        charset="utf-8", headers=out)


@web.middleware
async def s3_error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except ProtocolError as exc:
        status, code = s3_code(exc)
        return error_response(request, status, code, str(exc)[:500], error_headers(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(request, exc.status, exc.reason)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except (HttpProcessingError, RequestPayloadError) as exc:
        return error_response(request, 400, "IncompleteBody",
                              f"unreadable request body: {exc}"[:300])
    except Exception as exc:
        _unexpected.log(logging.ERROR, "unhandled", "unhandled error serving S3 %s %s",
                        request.method, request.path, first_exc=exc)
        return error_response(request, 500, "InternalError", "unexpected server error")
    if response.status >= 400 and response.content_type == PROBLEM_JSON:
        return _translated(request, response)
    return response


_REFUSAL_CODES = {400: "InvalidRequest", 405: "MethodNotAllowed", 501: "NotImplemented",
                  505: "HttpVersionNotSupported"}


def refusal_response(status: int, title: str, detail: str) -> web.Response:
    """S3's XML for a request the front door refused before routing (garbage, an unknown
    method, another HTTP version): :data:`service.front.Renderer`."""
    rid = new_request_id()
    body = xml.error(_REFUSAL_CODES.get(status, "InvalidRequest"), detail, "", rid)
    return web.Response(status=status, body=body, content_type=xml.XML_TYPE, charset="utf-8",
                        headers={AMZ_REQUEST_ID: rid, REQUEST_ID_HEADER: rid})


def _http_error(request: web.Request, status: int, reason: str) -> web.Response:
    codes = {404: "NoSuchKey", 405: "MethodNotAllowed", 413: "EntityTooLarge",
             501: "NotImplemented"}
    if status == 429:
        return error_response(request, 503, "SlowDown", reason)
    return error_response(request, status if status < 500 else 501,
                          codes.get(status, "InvalidRequest"), reason)


def _translated(request: web.Request, response: web.StreamResponse) -> web.Response:
    """A problem+json answer from shared middleware (the in-flight cap's 429), as S3's."""
    detail = ""
    if isinstance(response, web.Response) and response.body is not None:
        try:
            detail = str(json.loads(bytes(response.body)).get("detail", ""))  # type: ignore[arg-type]
        except (ValueError, AttributeError, TypeError):
            detail = ""
    retry = {"Retry-After": response.headers["Retry-After"]} if "Retry-After" in response.headers \
        else None
    if response.status == 429:
        return error_response(request, 503, "SlowDown", detail or "slow down", retry)
    status = response.status if response.status < 500 else 503
    return error_response(request, status, "InvalidRequest" if status < 500 else
                          "ServiceUnavailable", detail, retry)
