"""Read a ``multipart/byteranges`` body (RFC 9110 §14.6) back into its parts.

The client side of batched reads: one request asks for many sample ranges, the
answer carries each as a part with its own ``Content-Range``.
"""

from __future__ import annotations

import re

from protocol.errors import ProtocolError
from protocol.ranges import ByteRange

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_CONTENT_RANGE = re.compile(rb"bytes (\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


class BadMultipart(ProtocolError):
    """A multipart/byteranges body that does not parse or lies about its parts."""

    status_hint = 502
    title = "Bad multipart/byteranges answer"


def boundary_of(content_type: str) -> str:
    match = _BOUNDARY.search(content_type)
    if not content_type.lower().startswith("multipart/byteranges") or match is None:
        raise BadMultipart(f"not multipart/byteranges with a boundary: {content_type!r}")
    return match.group(1)


def parse_byteranges(content_type: str, body: bytes) -> list[tuple[ByteRange, bytes]]:
    """The parts of ``body``: each part's object range and its bytes, in body order."""
    delimiter = b"--" + boundary_of(content_type).encode("ascii")
    parts: list[tuple[ByteRange, bytes]] = []
    position = body.find(delimiter)
    if position < 0:
        raise BadMultipart("no boundary in the body")
    while True:
        position += len(delimiter)
        if body.startswith(b"--", position):
            return parts  # the closing delimiter
        head_end = body.find(b"\r\n\r\n", position)
        if head_end < 0:
            raise BadMultipart("a part's headers never end")
        r = _part_range(body[position:head_end])
        start = head_end + 4
        data = body[start:start + r.length]
        if len(data) != r.length or not body.startswith(b"\r\n" + delimiter, start + r.length):
            raise BadMultipart(f"part {len(parts)} is not {r.length} bytes long")
        parts.append((r, data))
        position = start + r.length + 2


def _part_range(headers: bytes) -> ByteRange:
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-range":
            match = _CONTENT_RANGE.fullmatch(value.strip())
            if match is None:
                break
            first, last = int(match.group(1)), int(match.group(2))
            if last < first:
                break
            return ByteRange(first, last + 1)
    raise BadMultipart("a part has no usable Content-Range")


def slice_parts(parts: list[tuple[ByteRange, bytes]], wanted: ByteRange) -> bytes:
    """The bytes of ``wanted`` out of the parts (a server may have merged ranges)."""
    for r, data in parts:
        if r.start <= wanted.start and wanted.stop <= r.stop:
            return data[wanted.start - r.start:wanted.stop - r.start]
    raise BadMultipart(f"no part holds bytes {wanted.start}-{wanted.stop - 1}")
