"""``/list`` answers, framed the same on hub and spoke.

A loader must not tell the two apart by their headers (only ``X-Cache`` differs), so
both build the answer here. The body is JSON, or msgpack for a client that accepts
it: it varies with ``Accept``, and caches are told so.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Awaitable, Callable

import msgpack
from aiohttp import web

logger = logging.getLogger(__name__)

Entries = list[dict[str, object]]
# A msgpack answer names its count before its items: the packed items wait in a file
# that spills to disk past this size, so a listing of any length holds bounded memory.
SPOOL_IN_MEMORY_BYTES = 1 << 20
SEND_BLOCK_BYTES = 256 << 10

MSGPACK = "application/msgpack"
JSON = "application/json"


def wants_msgpack(accept: str) -> bool:
    return MSGPACK in accept


def list_response(accept: str, prefix: str, entries: list[dict[str, object]]) -> web.Response:
    """The answer listing ``entries`` under ``prefix``, in the form ``accept`` asks for."""
    doc = {"prefix": prefix, "objects": entries}
    if wants_msgpack(accept):
        return listing(msgpack.packb(doc, use_bin_type=True), MSGPACK)
    return listing(json.dumps(doc).encode(), JSON)


def listing(body: bytes, content_type: str) -> web.Response:
    """A ``/list`` answer of ``body``, already encoded as ``content_type`` (a spoke
    relays its hub's)."""
    packed = content_type == MSGPACK
    return web.Response(
        body=body, content_type=MSGPACK if packed else JSON,
        charset=None if packed else "utf-8", headers={"Vary": "Accept"},
    )


async def stream_list_response(
    request: web.Request, prefix: str, next_entries: Callable[[], Awaitable[Entries]]
) -> web.StreamResponse:
    """The same answer as :func:`list_response`, built from batches of entries that
    ``next_entries`` returns until an empty one, never all in memory at once.

    The first batch is asked for before any header is sent, so a backend that fails at
    once gets a proper error answer; a later failure can only cut the body.
    """
    packed = wants_msgpack(request.headers.get("Accept", ""))
    batch = await next_entries()
    response = web.StreamResponse(headers={"Vary": "Accept"})
    response.content_type = MSGPACK if packed else JSON
    if not packed:
        response.charset = "utf-8"
    if packed:
        return await _send_msgpack(request, response, prefix, batch, next_entries)
    await response.prepare(request)
    try:
        await response.write(b'{"prefix": ' + json.dumps(prefix).encode() + b', "objects": [')
        first = True
        while batch:
            text = ", ".join(json.dumps(entry) for entry in batch)
            await response.write((text if first else ", " + text).encode())
            first = False
            batch = await next_entries()
        await response.write(b"]}")
    except ConnectionError:
        raise
    except Exception as exc:
        _cut(request, exc)
        return response
    await response.write_eof()
    return response


async def _send_msgpack(
    request: web.Request, response: web.StreamResponse, prefix: str, batch: Entries,
    next_entries: Callable[[], Awaitable[Entries]],
) -> web.StreamResponse:
    packer = msgpack.Packer(use_bin_type=True)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES) as spool:
        count = 0
        while batch:
            spool.write(b"".join(packer.pack(entry) for entry in batch))
            count += len(batch)
            batch = await next_entries()
        head = (packer.pack_map_header(2) + packer.pack("prefix") + packer.pack(prefix)
                + packer.pack("objects") + packer.pack_array_header(count))
        response.content_length = len(head) + spool.tell()
        spool.seek(0)
        await response.prepare(request)
        await response.write(head)
        while block := spool.read(SEND_BLOCK_BYTES):
            await response.write(block)
    await response.write_eof()
    return response


def _cut(request: web.Request, exc: Exception) -> None:
    logger.warning("aborting %s %s mid-listing: %s", request.method, request.path, exc)
    if request.transport is not None:
        request.transport.abort()
