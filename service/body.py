"""Send a :class:`protocol.response.ResponsePlan` over aiohttp.

Where the bytes of an object range come from is the caller's business: the hub
reads its file, the spoke its chunks. This module only frames them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from protocol.ranges import ByteRange
from protocol.response import ResponsePlan

RangeWriter = Callable[[ByteRange, web.StreamResponse], Awaitable[None]]


async def send_plan(
    request: web.Request,
    plan: ResponsePlan,
    write_range: RangeWriter,
    extra_headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with ``plan``, pulling object bytes through ``write_range``."""
    response = web.StreamResponse(status=plan.status)
    for name, value in plan.headers:
        response.headers[name] = value
    if extra_headers:
        response.headers.update(extra_headers)
    if plan.status == 304:
        del response.headers["Content-Length"]
    elif plan.body or plan.status in (200, 206):
        response.content_length = plan.content_length
    await response.prepare(request)
    if request.method == "HEAD" or plan.status == 304:
        return response
    for part in plan.body:
        if isinstance(part, bytes):
            await response.write(part)
        else:
            await write_range(part, response)
    await response.write_eof()
    return response
