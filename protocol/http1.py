"""A strict reader of HTTP/1.1 request heads, for the spoke's fast path.

Not a general parser. It accepts one narrow, unambiguous shape, the one loaders
send for reads (``GET``/``HEAD``, origin-form target of plain characters, HTTP/1.1,
no body, each field once) and answers ``None`` for anything else. A request it
refuses goes to aiohttp's complete parser, so this one never has to decide what a
malformed or unusual request means, and never answers one differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# RFC 9110 §5.6.2 token characters.
_FIELD = re.compile(
    rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?[ \t]*"
)
# Origin-form path without percent-encoding, query or fragment: what it means is
# then the same to every parser, aiohttp's included.
_REQUEST_LINE = re.compile(rb"(GET|HEAD) (/[A-Za-z0-9._~!$&'()*+,;=:@/-]*) HTTP/1\.1")
# Fields that change how the message is framed or the connection used: their
# handling (and their errors) stay aiohttp's.
_FRAMING = frozenset({"transfer-encoding", "upgrade", "expect", "te", "trailer"})

MAX_HEAD_BYTES = 16 << 10
# Below aiohttp's own limits (8190-byte request line, 128 fields), so whatever this
# reader takes, aiohttp would have taken too.
MAX_REQUEST_LINE_BYTES = 8190
MAX_FIELDS = 100


class Headers(dict[str, str]):
    """Request fields by lower-case name; lookups ignore case, as field names do."""

    __slots__ = ()

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    headers: Headers
    keep_alive: bool


def parse_request_head(head: bytes) -> RequestHead | None:
    """The request in ``head`` (up to, not including, the blank line), or ``None``
    when it is outside the subset this reader takes."""
    if len(head) > MAX_HEAD_BYTES:
        return None
    lines = head.split(b"\r\n")
    if len(lines) > MAX_FIELDS + 1 or len(lines[0]) > MAX_REQUEST_LINE_BYTES:
        return None
    line = _REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        return None
    headers = Headers()
    for raw in lines[1:]:
        field = _FIELD.fullmatch(raw)
        if field is None:
            return None  # obs-fold, bare CR or LF, control bytes, non-ASCII, no colon...
        name = field[1].decode("ascii").lower()
        if name in headers or name in _FRAMING:
            return None
        headers[name] = (field[2] or b"").decode("ascii")
    if "host" not in headers or headers.get("content-length", "0") != "0":
        return None
    connection = (headers.get("connection") or "").lower()
    options = {o.strip() for o in connection.split(",")} if connection else set()
    if "upgrade" in options:
        return None
    return RequestHead(
        method=line[1].decode("ascii"),
        target=line[2].decode("ascii"),
        headers=headers,
        keep_alive="close" not in options,
    )
