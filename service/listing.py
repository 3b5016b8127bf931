"""``/list`` answers, framed the same on hub and spoke.

A loader must not tell the two apart by their headers (only ``X-Cache`` differs), so
both build the answer here. The body is JSON, or msgpack for a client that accepts
it: it varies with ``Accept``, and caches are told so.
"""

from __future__ import annotations

import json

import msgpack
from aiohttp import web

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
