"""HTTP/1 heads: a strict request reader for the spoke's fast path, a screen in front
of aiohttp's request parser (:class:`RequestScreen`), and the response-head reader of
the spoke's own connections to the hub (:func:`parse_response_head`).

The reader is not a general parser. It accepts one narrow, unambiguous shape, the one loaders
send for reads (``GET``/``HEAD``, origin-form target of plain characters, HTTP/1.1,
no body, each field once) and answers ``None`` for anything else. A request it
refuses goes to aiohttp's complete parser, so this one never has to decide what a
malformed or unusual request means, and never answers one differently.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from protocol.errors import (
    MalformedRequest,
    MalformedResponse,
    ProtocolError,
    UnknownMethod,
    UnsupportedVersion,
)
from protocol.headers import REQUEST_ID_HEADER

# The patterns match the head decoded as latin-1, which maps each byte to the code
# point of the same value: a class means the same bytes it would in a bytes pattern,
# and the head is decoded once rather than once per field.

# Origin-form path without percent-encoding, query or fragment: what it means is
# then the same to every parser, aiohttp's included. No class admits CR, so a match
# is the whole first line or nothing.
_REQUEST_LINE = re.compile(r"(GET|HEAD) (/[A-Za-z0-9._~!$&'()*+,;=:@/-]*) HTTP/1\.1(?=\r\n|\Z)")
# The same with percent-encoding and a query (RFC 3986's pchar and query), for a reader
# whose handler decodes the target itself (the spoke's S3 front end).
_REQUEST_LINE_WITH_QUERY = re.compile(
    r"(GET|HEAD) (/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*(?:\?[A-Za-z0-9._~!$&'()*+,;=:@/?%-]*)?)"
    r" HTTP/1\.1(?=\r\n|\Z)"
)
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
    "Authorization", "If-Match", "If-None-Match", REQUEST_ID_HEADER, "Content-Length",
    # botocore's, on every S3 request
    "X-Amz-Date", "X-Amz-Content-SHA256", "amz-sdk-invocation-id", "amz-sdk-request",
)}

# The largest request head the fast path's reader takes; a larger one is aiohttp's.
MAX_REQUEST_HEAD_BYTES = 16 << 10
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


# Not frozen: a frozen dataclass's __init__ costs more than the rest of a cached read,
# and one is made per request. Nothing changes one once it is made.
@dataclass(slots=True)
class RequestHead:
    method: str
    target: str
    headers: Headers
    keep_alive: bool


# Heads read before, by their bytes with the digits of a ``Range: bytes=`` field taken
# out: a loader sends the same fields again and again, only the range changes. Those
# digits change nothing but that field's value (a value of those characters is taken
# like any other), so a head of the same shape reads the same. Keyed apart by
# ``with_query``; cleared when full.
MAX_KNOWN_SHAPES = 256
MAX_SHAPED_HEAD_BYTES = 4 << 10
_RANGE_FIELD = b"\r\nRange: bytes="
_RANGE_VALUE_AT = len(_RANGE_FIELD) - len(b"bytes=")
_RANGE_CHARS = b"0123456789,-"
# Fields S3 clients sign or number each request with: a head holding one is never sent
# twice, so its shape is not worth remembering (the copy and hash of it cost more than
# the rest of the read).
_ONCE_ONLY_FIELDS = (b"\r\nX-Amz-Date:", b"\r\nx-amz-date:", b"\r\namz-sdk-invocation-id:")
_Shape = tuple[str, str, dict[str, str], bool] | None
_shapes: tuple[dict[bytes, _Shape], dict[bytes, _Shape]] = ({}, {})


def parse_request_head(
    head: bytes | bytearray, *, with_query: bool = False
) -> RequestHead | None:
    """The request in ``head`` (up to, not including, the blank line), or ``None``
    when it is outside the subset this reader takes. ``with_query``: targets may hold
    percent-encodings and a query too, left as sent for the handler to decode.

    A head of a shape read before (the same bytes but for its ``Range: bytes=`` digits)
    is not read again: its fields are copied, with its own Range."""
    size = len(head)
    if size > MAX_REQUEST_HEAD_BYTES:
        return None
    if with_query:
        # Fields are looked for among the fields only, after the request line (a
        # presigned URL's query is most of the head): each starts with a CRLF, which the
        # line holds none of. Each once-only name holds "mz-": one look rules all out.
        fields_at = head.find(b"\r\n")
        if fields_at < 0:
            return _parse(head, with_query)
        # (find, not ``in``: that tries its operand as an int first, and pays for the error.)
        lines = head[fields_at:]
        if lines.find(b"mz-") >= 0 and (lines.find(_ONCE_ONLY_FIELDS[0]) >= 0
                                        or lines.find(_ONCE_ONLY_FIELDS[1]) >= 0
                                        or lines.find(_ONCE_ONLY_FIELDS[2]) >= 0):
            return _parse(head, with_query)
        at = lines.find(_RANGE_FIELD)
        if at >= 0:
            at += fields_at
    else:
        at = head.find(_RANGE_FIELD)
    if at < 0 or size > MAX_SHAPED_HEAD_BYTES:
        return _parse(head, with_query)
    start = at + len(_RANGE_FIELD)
    stop = head.find(b"\r\n", start)
    if stop < 0:
        stop = size
    digits = head[start:stop]
    if not digits or digits.translate(None, _RANGE_CHARS):
        return _parse(head, with_query)
    key = bytes(head[:start]) + bytes(head[stop:]) if stop < size else bytes(head[:start])
    shapes = _shapes[with_query]
    try:
        shape = shapes[key]
    except KeyError:
        read = _parse(head, with_query)
        if len(shapes) >= MAX_KNOWN_SHAPES:
            shapes.clear()
        shapes[key] = None if read is None else (
            read.method, read.target, dict(read.headers), read.keep_alive)
        return read
    if shape is None:
        return None
    method, target, fields, keep_alive = shape
    headers = Headers(fields)
    headers["range"] = head[at + _RANGE_VALUE_AT:stop].decode("latin-1")
    return RequestHead(method, target, headers, keep_alive)


def _parse(head: bytes | bytearray, with_query: bool) -> RequestHead | None:
    text = head.decode("latin-1")
    count = text.count("\r\n")
    if count > MAX_FIELDS:
        return None
    line = (_REQUEST_LINE_WITH_QUERY if with_query else _REQUEST_LINE).match(text)
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


# The starts of the requests the reader takes: bytes that begin otherwise never will be one.
_PLAIN_STARTS = (b"GET /", b"HEAD /")


def could_start_plain_read(start: bytes | bytearray) -> bool:
    """Whether a request beginning with ``start`` (its first bytes, the head not yet
    complete) may still be one :func:`parse_request_head` takes."""
    return any(s.startswith(bytes(start[:len(s)])) for s in _PLAIN_STARTS)


# ---------------------------------------------------------------------------
# response heads, as the spoke's chunk connections read the hub's

# The largest response head a client of ours reads (the hub's are a few hundred bytes).
MAX_RESPONSE_HEAD_BYTES = 64 << 10
# RFC 9112 §4: HTTP-version SP status-code [SP reason-phrase]; any 1.x version (a
# recipient reads a later minor version as the highest it knows, §2.6).
_STATUS_LINE = re.compile(r"HTTP/1\.([0-9]) ([0-9]{3})(?: [\t\x20-\x7e\x80-\xff]*+)?(?=\r\n|\Z)")
# The control characters (RFC 9110 §5.5): a head holds none but HTAB and the CRLFs
# that end its lines. obs-text (0x80-0xFF) is a server's to send.
_CONTROLS = bytes(range(0x20)).replace(b"\t", b"") + b"\x7f"
_TOKEN_TEXT = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Names servers commonly send (the hub's, aiohttp's): as _LOWER.
_RESPONSE_LOWER = {name: name.lower() for name in (
    "Content-Type", "Content-Length", "Content-Range", "ETag", "Last-Modified",
    "Accept-Ranges", "Cache-Control", "Date", "Server", "Connection", REQUEST_ID_HEADER,
)}
# A Content-Length longer than this is past any object: the body is not ours to read.
_MAX_LENGTH_DIGITS = 18


# Not frozen: a frozen dataclass's __init__ costs more than the rest of the record,
# once per chunk the hub sends.
@dataclass(slots=True)
class ResponseHead:
    status: int
    # By lower-case name (a plain dict: the names are lowered once, here); a field
    # sent more than once has its values joined with ", ".
    headers: dict[str, str]
    keep_alive: bool  # RFC 9112 §9.3, for a body framed by its Content-Length
    # None: the body is not framed by one plain Content-Length (absent, not a number,
    # or Transfer-Encoding, which overrides it, RFC 9112 §6.3).
    content_length: int | None


def parse_response_head(head: bytes | bytearray | memoryview) -> ResponseHead:
    """The response in ``head`` (up to, not including, the blank line).

    Raises :class:`MalformedResponse` for a head that is not a plain HTTP/1.x one:
    a bad status line, a line that is not a ``name: value`` field (obs-fold, bare CR
    or LF, control bytes, whitespace before the colon), or more than
    ``MAX_RESPONSE_HEAD_BYTES``. What it reads, it reads as aiohttp's parser does.
    """
    if len(head) > MAX_RESPONSE_HEAD_BYTES:
        raise MalformedResponse(f"a response head over {MAX_RESPONSE_HEAD_BYTES} bytes")
    raw = bytes(head)
    text = raw.decode("latin-1")
    line = _STATUS_LINE.match(text)
    if line is None:
        first = text.split("\r\n", 1)[0]
        raise MalformedResponse(f"a malformed status line {first[:80]!r}")
    lines = text.split("\r\n")
    # One C pass over the head, then str methods per line (a regex per field, or one
    # over the head, costs more than the rest of the parse): no controls but the
    # CRLFs, so no bare CR or LF, no NUL.
    if len(raw) - len(raw.translate(None, _CONTROLS)) != 2 * (len(lines) - 1):
        raise MalformedResponse("a malformed response header")
    headers: dict[str, str] = {}
    for field in lines[1:]:
        name, colon, value = field.partition(":")
        key = _RESPONSE_LOWER.get(name)
        if key is None or not colon:
            # Not a token (empty, obs-fold, whitespace before the colon), or no colon.
            if not colon or _TOKEN_TEXT.fullmatch(name) is None:
                raise MalformedResponse("a malformed response header")
            key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    length = headers.get("content-length")
    # isascii: str.isdigit() takes '²', which int() refuses.
    if length is None or not (length.isascii() and length.isdigit()) \
            or len(length) > _MAX_LENGTH_DIGITS or "transfer-encoding" in headers:
        content_length = None
    else:
        content_length = int(length)
    http10 = line[1] == "0"
    keep_alive = not http10
    connection = headers.get("connection")
    if connection:
        options = {o.strip(" \t").lower() for o in connection.split(",")}
        keep_alive = "close" not in options and (not http10 or "keep-alive" in options)
    return ResponseHead(int(line[2]), headers, keep_alive, content_length)


# ---------------------------------------------------------------------------
# the screen in front of aiohttp's parser

# The methods of RFC 9110 §9, and PATCH (RFC 5789): a route that does not take one
# answers 405 with Allow. Any other method is one no route of ours knows: 501 (§15.6.2).
KNOWN_METHODS = frozenset({
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH",
})
_METHOD_STARTS = frozenset(m[:i] for m in KNOWN_METHODS for i in range(1, len(m) + 1))
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]*")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_BLANK_LINES = re.compile(rb"[\r\n]*")
# A head larger than this goes to the parser behind unscreened (it takes up to 128
# fields of 32 KiB each): the screen keeps a copy of the head it reads.
MAX_SCREENED_HEAD_BYTES = 64 << 10
MAX_CHUNK_LINE_BYTES = 4096


class _State(enum.Enum):
    LINE = "request line"
    HEAD = "header fields"
    BODY = "content"
    CHUNK_LINE = "chunk size line"
    CHUNK_DATA = "chunk data"
    TRAILER = "trailer fields"
    DONE = "after the last request"  # dropped: RFC 9112 §9.6
    REFUSED = "after a refused request"  # dropped
    OPEN = "unscreened"  # passed on as it comes


class RequestScreen:
    """Reads a connection's bytes ahead of a full HTTP/1 parser (bytes in, bytes out)
    and stops what that parser gets wrong:

    - an unknown method (501) or an HTTP version other than 1.0 and 1.1 (505), which
      it refuses as a plain 400 or, for ``HTTP/2.0``, takes;
    - bytes that cannot start a request line at all (a TLS hello, garbage), refused
      400 as soon as they arrive, not once a line ends;
    - the bytes after a request that closes the connection, which a server must not
      process (RFC 9112 §9.6): they are dropped, where the parser refuses them and
      loses the answers of the requests before the close with them.

    It frames each message (Content-Length, chunked) to find where the next request
    line starts. What it cannot frame for certain (bare LF line ends, a repeated or
    malformed Content-Length, other transfer codings, an upgrade, a huge head) it
    passes on unscreened from then on: the parser behind judges that connection
    alone, as it did before.
    """

    def __init__(self) -> None:
        self._state = _State.LINE
        self._buf = bytearray()  # the request line, head or chunk line being read
        self._left = 0  # content or chunk bytes still to pass on
        self._http10 = False
        self._closing = False  # the current request is the connection's last

    def receive(self, data: bytes) -> tuple[bytes, ProtocolError | None]:
        """The part of ``data`` the parser behind may have, and the error to answer
        once it has answered the requests in that part; after an error, or the end
        of a request that closes the connection, nothing more passes."""
        out = bytearray()
        pos = 0
        try:
            while pos < len(data):
                state = self._state
                if state is _State.OPEN:
                    out += data[pos:]
                    break
                if state is _State.DONE or state is _State.REFUSED:
                    break
                pos = self._STEPS[state](self, data, pos, out)
        except ProtocolError as exc:
            self._state = _State.REFUSED
            return bytes(out), exc
        return bytes(out), None

    # -- one step per state: consume from data[pos:], append what passes to out ----

    def _request_line(self, data: bytes, pos: int, out: bytearray) -> int:
        if not self._buf:
            # Empty lines before a request line are the parser's to skip (RFC 9112 §2.2).
            blank = _BLANK_LINES.match(data, pos).end()  # type: ignore[union-attr]
            out += data[pos:blank]
            pos = blank
        held = len(self._buf)
        self._buf += data[pos:]  # held back until the line is known to be fit to pass
        end = self._buf.find(b"\n")
        if end < 0:
            _check_method(bytes(self._buf), complete=False)
            if len(self._buf) > MAX_REQUEST_LINE_BYTES:
                self._open(out)  # the parser behind says what it thinks of that line
            return len(data)
        line = bytes(self._buf[:end].rstrip(b"\r"))
        # The version first: it says how to read the rest (PRI * HTTP/2.0 is a 505).
        http10 = _check_version(line)
        _check_method(line, complete=True)
        del self._buf[end + 1:]
        out += self._buf
        if http10 is None:
            self._open(None)  # a version it cannot read: the parser behind's call
        else:
            self._http10, self._state = http10, _State.HEAD
        return pos + end + 1 - held

    def _header_fields(self, data: bytes, pos: int, out: bytearray) -> int:
        seen = len(self._buf)
        self._buf += data[pos:]
        end = self._buf.find(b"\r\n\r\n", max(0, seen - 3))
        stop = len(self._buf) if end < 0 else end + 4
        out += data[pos:pos + stop - seen]
        head = self._buf[:stop]
        if head.count(b"\n") != head.count(b"\r\n") or len(head) > MAX_SCREENED_HEAD_BYTES:
            self._open(None)  # bare LFs: where this head ends is the parser's call
        elif end >= 0:
            self._frame(bytes(self._buf[:end]))
        return pos + stop - seen

    def _content(self, data: bytes, pos: int, out: bytearray) -> int:
        taken = min(self._left, len(data) - pos)
        out += data[pos:pos + taken]
        self._left -= taken
        if not self._left:
            if self._state is _State.CHUNK_DATA:
                self._state = _State.CHUNK_LINE
            else:
                self._end_message()
        return pos + taken

    def _chunk_line(self, data: bytes, pos: int, out: bytearray) -> int:
        pos, line = self._line(data, pos, out)
        if line is None:
            return pos
        size = line.split(b";", 1)[0].strip(b" \t")
        if _HEX.fullmatch(size) is None:
            self._open(None)
        elif int(size, 16) == 0:
            self._state = _State.TRAILER
        else:
            self._left, self._state = int(size, 16) + 2, _State.CHUNK_DATA  # data, CRLF
        return pos

    def _trailer_fields(self, data: bytes, pos: int, out: bytearray) -> int:
        pos, line = self._line(data, pos, out)
        if line == b"":
            self._end_message()
        return pos

    _STEPS: ClassVar[dict[_State, Callable[[RequestScreen, bytes, int, bytearray], int]]] = {
        _State.LINE: _request_line, _State.HEAD: _header_fields, _State.BODY: _content,
        _State.CHUNK_LINE: _chunk_line, _State.CHUNK_DATA: _content,
        _State.TRAILER: _trailer_fields,
    }

    # -- helpers ------------------------------------------------------------

    def _line(self, data: bytes, pos: int, out: bytearray) -> tuple[int, bytes | None]:
        """Pass on the bytes of a CRLF-ended line; the line once it is complete."""
        end = data.find(b"\n", pos)
        stop = len(data) if end < 0 else end + 1
        out += data[pos:stop]
        self._buf += data[pos:stop]
        if end < 0:
            if len(self._buf) > MAX_CHUNK_LINE_BYTES:
                self._open(None)
            return stop, None
        line = bytes(self._buf)
        self._buf.clear()
        if not line.endswith(b"\r\n"):
            self._open(None)
            return stop, None
        return stop, line[:-2]

    def _frame(self, head: bytes) -> None:
        """Where the message of ``head`` ends, and whether the connection ends with it."""
        self._buf.clear()
        fields = _framing_fields(head)
        if fields is None:
            self._open(None)
            return
        lengths, codings, options = fields
        self._closing = b"close" in options or (self._http10 and b"keep-alive" not in options)
        if codings == [b"chunked"] and not lengths:
            self._state = _State.CHUNK_LINE
        elif codings or len(lengths) > 1 or any(_DIGITS.fullmatch(v) is None for v in lengths):
            self._open(None)  # RFC 9112 §6.3: the parser behind refuses or decides
        elif lengths and int(next(iter(lengths))):
            self._left, self._state = int(next(iter(lengths))), _State.BODY
        else:
            self._end_message()

    def _end_message(self) -> None:
        self._state = _State.DONE if self._closing else _State.LINE

    def _open(self, out: bytearray | None) -> None:
        """Stop screening; ``out`` takes the bytes held back, if any."""
        if out is not None:
            out += self._buf
        self._buf.clear()
        self._state = _State.OPEN


def _check_method(line: bytes, complete: bool) -> None:
    """Raise unless ``line`` (a request line, or its start) begins with a method we
    know, or one that may still become one."""
    space = line.find(b" ")
    method = line[:space] if space >= 0 else line
    if not line and not complete:
        return  # nothing of it yet
    if _TOKEN.fullmatch(method) is None or (not method and (space >= 0 or complete)):
        raise MalformedRequest("the request does not start with a method")
    if space >= 0 or complete:
        if method not in KNOWN_METHODS:
            raise UnknownMethod("the request's method is not one this server implements")
    elif method not in _METHOD_STARTS:
        raise UnknownMethod("the request's method is not one this server implements")


def _check_version(line: bytes) -> bool | None:
    """Whether the request ``line`` is HTTP/1.0's; None when it names no version the
    screen can read (the parser behind decides). Raise for any version but 1.x."""
    version = _VERSION.fullmatch(line.rpartition(b" ")[2])
    if version is None:
        return None
    if version[1] != b"1" or version[2] not in (b"0", b"1"):
        raise UnsupportedVersion("this server speaks HTTP/1.1 (and 1.0) only")
    return version[2] == b"0"


def _framing_fields(head: bytes) -> tuple[set[bytes], list[bytes], set[bytes]] | None:
    """The Content-Length values, transfer codings and connection options of a
    request ``head``; None when its fields are not plain ``name: value`` lines or it
    asks for an upgrade (the parser behind handles those)."""
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    options: set[bytes] = set()
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None or not name:
            return None
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            lengths.add(value)
        elif name == b"transfer-encoding":
            codings += [c.strip(b" \t").lower() for c in value.split(b",")]
        elif name == b"connection":
            options |= {o.strip(b" \t").lower() for o in value.split(b",")}
        elif name == b"upgrade":
            return None
    return None if b"upgrade" in options else (lengths, codings, options)
