"""``multipart/byteranges`` (RFC 9110 §14.6): boundaries, and reading a body back.

The client side of batched reads: one request asks for many sample ranges, the
answer carries each as a part with its own ``Content-Range``. The server side
frames parts with a boundary that must not occur in them (RFC 2046 §5.1.1): fresh
randomness per response, so nobody can plant the next one in an object, and checked
against the parts' bytes where they are at hand before the head goes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol.errors import ProtocolError
from protocol.ranges import ByteRange, parse_content_range

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)


# 24 hex characters: 96 random bits, and the same framing length on hub and spoke.
BOUNDARY_BYTES = 12
Buffer = bytes | bytearray | memoryview


def new_boundary() -> str:
    """A boundary for one response, from the system's CSPRNG."""
    return secrets.token_hex(BOUNDARY_BYTES)


def boundary_occurs(boundary: str, part: Iterable[Buffer]) -> bool:
    """Whether ``--boundary`` occurs in one part's data, given as the pieces it is read
    in (a range over several chunks): within a piece or across two.

    ``--`` without the CRLF of the full delimiter also catches data that starts with
    ``--boundary`` right after the part head's blank line.
    """
    needle = b"--" + boundary.encode("ascii")
    overlap = len(needle) - 1
    tail = b""
    for piece in part:
        data = piece if isinstance(piece, bytes) else bytes(piece)
        if data.find(needle) >= 0 or (tail and (tail + data[:overlap]).find(needle) >= 0):
            return True
        tail = data[-overlap:] if len(data) >= overlap else (tail + data)[-overlap:]
    return False


_HEX = 2 * BOUNDARY_BYTES
_DELIMITER_LIKE = re.compile(rb"--([0-9a-f]{%d})" % _HEX)
# A chunk's first and last bytes: enough for a delimiter across two of them.
_EDGE = _HEX + 1


@dataclass(frozen=True, slots=True)
class DelimiterScan:
    """Where a block of bytes (a cached chunk) could hold any boundary of ours:
    ``--`` and 24 hex characters, found once, checked against each answer's boundary
    without reading the bytes again."""

    found: tuple[tuple[int, bytes], ...]  # (offset of the "--", the 24 characters)
    head: bytes
    tail: bytes


def scan_for_delimiters(data: bytes) -> DelimiterScan:
    found = tuple((m.start(), m.group(1)) for m in _DELIMITER_LIKE.finditer(data))
    return DelimiterScan(found, data[:_EDGE], data[-_EDGE:])


def scanned_part_holds(boundary: str, slices: Sequence[tuple[DelimiterScan, int, int]]) -> bool:
    """Whether ``--boundary`` occurs in one part made of ``slices`` ([lo, hi) of each
    scanned block, in order; each after the first starts at its block's beginning,
    each before the last ends at its block's end)."""
    token = boundary.encode("ascii")
    needle = b"--" + token
    previous: DelimiterScan | None = None
    for scan, lo, hi in slices:
        if scan.found and any(
            t == token and lo <= at and at + len(needle) <= hi for at, t in scan.found
        ):
            return True
        if previous is not None and needle in previous.tail + scan.head:
            return True  # across the join; a false alarm at worst, for a short slice
        previous = scan
    return False


def boundary_avoiding(parts: list[list[Buffer]]) -> str:
    """A fresh boundary that occurs in none of ``parts``."""
    while True:
        boundary = new_boundary()
        if not any(boundary_occurs(boundary, part) for part in parts):
            return boundary


class BoundaryInData(ProtocolError):
    """A part's bytes hold the boundary of an answer whose head is already sent."""

    status_hint = 500
    title = "Multipart boundary in the data"


class BoundaryWatch:
    """Checks a body's parts as they stream out, for a head already sent: the caller
    cuts the response when :meth:`clean` turns False, before those bytes go."""

    def __init__(self, boundary: str) -> None:
        self._boundary = boundary
        self._needle = b"--" + boundary.encode("ascii")
        self._tail = b""

    def next_part(self) -> None:
        self._tail = b""

    def clean(self, data: Buffer) -> bool:
        """Whether ``data``, the next bytes of the current part, keep it free of the
        boundary."""
        if boundary_occurs(self._boundary, (self._tail, data)):
            return False
        joined = self._tail + bytes(data[-len(self._needle):])
        self._tail = joined[-(len(self._needle) - 1):]
        return True


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
            parsed = parse_content_range(value.decode("latin-1"))
            if parsed is None or parsed.range is None:
                break
            return parsed.range
    raise BadMultipart("a part has no usable Content-Range")


def slice_parts(parts: list[tuple[ByteRange, bytes]], wanted: ByteRange) -> bytes:
    """The bytes of ``wanted`` out of the parts (a server may have merged ranges)."""
    for r, data in parts:
        if r.start <= wanted.start and wanted.stop <= r.stop:
            return data[wanted.start - r.start:wanted.stop - r.start]
    raise BadMultipart(f"no part holds bytes {wanted.start}-{wanted.stop - 1}")
