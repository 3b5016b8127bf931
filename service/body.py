"""Send a :class:`protocol.response.ResponsePlan` over aiohttp.

Where the bytes of an object range come from is the caller's business: the hub
reads its file, the spoke its chunks. This module only frames them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from protocol.ranges import ByteRange
from protocol.response import ResponsePlan

logger = logging.getLogger(__name__)

RangeWriter = Callable[[ByteRange, web.StreamResponse], Awaitable[None]]


async def send_plan(
    request: web.Request,
    plan: ResponsePlan,
    write_range: RangeWriter,
    headers: Iterable[tuple[str, str]] | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with ``plan``, pulling object bytes through ``write_range``.

    ``headers`` replace the plan's (a caller adding its own passes them all).
    """
    response = web.StreamResponse(status=plan.status)
    for name, value in plan.headers if headers is None else headers:
        response.headers[name] = value
    if plan.status == 304:
        response.headers.pop("Content-Length", None)
    elif plan.body or plan.status in (200, 206):
        response.content_length = plan.content_length
    await response.prepare(request)
    if request.method == "HEAD" or plan.status == 304:
        return response
    try:
        for part in plan.body:
            if isinstance(part, bytes):
                await response.write(part)
            else:
                await write_range(part, response)
    except ConnectionError:
        raise  # the client went away; aiohttp handles that quietly
    except Exception as exc:
        # Headers are gone: the only honest signal left is a cut connection, which
        # the client sees as a short body. Never pad or splice other bytes in.
        logger.warning("aborting %s %s mid-body: %s", request.method, request.path, exc)
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response
