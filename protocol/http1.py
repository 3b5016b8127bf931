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

# The patterns match the head decoded as latin-1, which maps each byte to the code
# point of the same value: a class means the same bytes it would in a bytes pattern,
# and the head is decoded once rather than once per field.

# Origin-form path without percent-encoding, query or fragment: what it means is
# then the same to every parser, aiohttp's included. No class admits CR, so a match
# is the whole first line or nothing.
_REQUEST_LINE = re.compile(r"(GET|HEAD) (/[A-Za-z0-9._~!$&'()*+,;=:@/-]*) HTTP/1\.1(?=\r\n|\Z)")
# A field line, from its leading CRLF: a name of RFC 9110 §5.6.2 token characters,
# then a value of visible ASCII, space and tab (the reader strips its trailing spaces
# and tabs). No class admits CR or LF, so a match never spans two lines, and the
# lookahead makes it cover the whole of one; findall skips a line that does not
# match, so the reader counts what it found against the CRLFs. Possessive
# quantifiers never backtrack: even a line that fails costs time linear in its length.
_FIELD = re.compile(
    r"\r\n([!#$%&'*+.^_`|~0-9A-Za-z-]++):[ \t]*+([\x20-\x7e\t]*+)(?=\r\n|\Z)"
)
# Fields that change how the message is framed or the connection used: their
# handling (and their errors) stay aiohttp's.
_FRAMING = frozenset({"transfer-encoding", "upgrade", "expect", "te", "trailer"})
# Names clients commonly send: a dict hit costs less than str.lower.
_LOWER = {name: name.lower() for name in (
    "Host", "User-Agent", "Accept", "Accept-Encoding", "Range", "Connection",
    "Authorization", "If-Match", "If-None-Match", "X-Request-Id", "Content-Length",
)}

MAX_HEAD_BYTES = 16 << 10
# Below aiohttp's own limits (8190-byte request line, 128 fields), so whatever this
# reader takes, aiohttp would have taken too.
MAX_REQUEST_LINE_BYTES = 8190
MAX_FIELDS = 100

# Called directly: super() costs more than the lookups themselves.
_dict_get = dict.get
_dict_getitem = dict.__getitem__
_dict_contains = dict.__contains__


class Headers(dict[str, str]):
    """Request fields by lower-case name; lookups ignore case, as field names do."""

    __slots__ = ()

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return _dict_get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return _dict_getitem(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _dict_contains(self, name.lower())


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    headers: Headers
    keep_alive: bool


def parse_request_head(head: bytes | bytearray) -> RequestHead | None:
    """The request in ``head`` (up to, not including, the blank line), or ``None``
    when it is outside the subset this reader takes."""
    if len(head) > MAX_HEAD_BYTES:
        return None
    text = head.decode("latin-1")
    count = text.count("\r\n")
    if count > MAX_FIELDS:
        return None
    line = _REQUEST_LINE.match(text)
    if line is None or (end := line.end()) > MAX_REQUEST_LINE_BYTES:
        return None
    headers = Headers()
    for name, value in _FIELD.findall(text, end):
        headers[_LOWER.get(name) or name.lower()] = value.rstrip(" \t")
    # Fewer names than lines: a line that is not a field (obs-fold, bare CR or LF,
    # control bytes, non-ASCII, no colon...), or a field twice.
    if len(headers) != count or not _FRAMING.isdisjoint(headers):
        return None
    # The names are lower-case already: dict's own methods skip Headers' lower().
    if not _dict_contains(headers, "host") or _dict_get(headers, "content-length", "0") != "0":
        return None
    keep_alive = True
    connection = _dict_get(headers, "connection")
    if connection:
        options = {o.strip() for o in connection.lower().split(",")}
        if "upgrade" in options:
            return None
        keep_alive = "close" not in options
    return RequestHead(line[1], line[2], headers, keep_alive)
