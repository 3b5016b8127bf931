"""The fast path's request-head reader: what it takes, it reads exactly as aiohttp does;
everything else it declines (None), for aiohttp to judge."""

from __future__ import annotations

import re

import pytest
from aiohttp.http_parser import HttpRequestParserPy
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import MalformedRequest, ProtocolError, UnknownMethod, UnsupportedVersion
from protocol.http1 import (
    MAX_FIELDS,
    MAX_REQUEST_HEAD_BYTES,
    MAX_REQUEST_LINE_BYTES,
    Headers,
    RequestScreen,
    could_start_plain_read,
    parse_request_head,
)
from tests.protocol.aiohttp_reference import first_message


def aiohttp_reads(head: bytes) -> tuple[str, str, dict[str, str], bool] | None:
    """What aiohttp's own (pure-Python) parser makes of ``head``; None if it refuses it."""
    msg = first_message(lambda proto, loop: HttpRequestParserPy(
        proto, loop, 2**16, max_line_size=8190, max_field_size=8190), head)
    if msg is None:
        return None
    headers = {k.lower(): v for k, v in msg.headers.items()}
    return msg.method, msg.path, headers, not msg.should_close


PLAIN = b"GET /objects/ds/a.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9"


def test_a_plain_read_is_taken_and_read_like_aiohttp() -> None:
    head = parse_request_head(PLAIN)
    assert head is not None
    assert (head.method, head.target, dict(head.headers), head.keep_alive) == aiohttp_reads(PLAIN)
    assert head.headers.get("RANGE") == "bytes=0-9" and "range" in head.headers


@pytest.mark.parametrize("head, keep_alive", [
    (PLAIN, True),
    (PLAIN + b"\r\nConnection: close", False),
    (PLAIN + b"\r\nConnection: keep-alive", True),
    (b"HEAD /objects/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0", True),
    (b"GET /objects/a HTTP/1.1\r\nHost:x\r\nX-Empty:\r\nX-Tab:\tv\t", True),
])
def test_taken(head: bytes, keep_alive: bool) -> None:
    parsed = parse_request_head(head)
    assert parsed is not None and parsed.keep_alive is keep_alive
    assert aiohttp_reads(head) == (parsed.method, parsed.target, dict(parsed.headers), keep_alive)


@pytest.mark.parametrize("head", [
    b"POST /objects/a HTTP/1.1\r\nHost: x",  # not a read
    b"GET /objects/a HTTP/1.0\r\nHost: x",  # other version: other keep-alive rules
    b"GET /objects/a%2e%2e HTTP/1.1\r\nHost: x",  # percent-encoding
    b"GET /objects/a?x=1 HTTP/1.1\r\nHost: x",  # a query
    b"GET http://h/objects/a HTTP/1.1\r\nHost: x",  # absolute-form
    b"GET /objects/a HTTP/1.1",  # no Host
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nHost: y",  # a field twice
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked",
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5",
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue",
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c",
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\n folded",  # obs-fold
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nBad Name: v",
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nX: caf\xc3\xa9",  # non-ASCII
    b"GET /objects/a HTTP/1.1\r\nHost: x\r\nX: a\x00b",  # NUL
    b"GET /objects/a HTTP/1.1\nHost: x",  # bare LF
    b"GET  /objects/a HTTP/1.1\r\nHost: x",
    b"get /objects/a HTTP/1.1\r\nHost: x",
    b"GET /objects/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x",  # past aiohttp's line limit
    b"GET /objects/a HTTP/1.1\r\nHost: x" + b"".join(
        b"\r\nX-%d: v" % i for i in range(MAX_FIELDS)),  # past the field count
])
def test_declined(head: bytes) -> None:
    assert parse_request_head(head) is None


TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_.!#$%&'*+^`|~", min_size=1,
                max_size=12)
VALUE = st.text("".join(chr(c) for c in range(0x20, 0x7F)) + "\t", max_size=40)
SEGMENT = st.text("abcXYZ019._~!$&'()*+,;=:@-", min_size=1, max_size=10)


@given(
    method=st.sampled_from(["GET", "HEAD"]),
    segments=st.lists(SEGMENT, min_size=1, max_size=4),
    fields=st.lists(st.tuples(TOKEN, VALUE), max_size=8),
)
def test_whatever_it_takes_aiohttp_reads_the_same(
    method: str, segments: list[str], fields: list[tuple[str, str]]
) -> None:
    lines = [f"{method} /objects/{'/'.join(segments)} HTTP/1.1", "Host: h"]
    lines += [f"{name}: {value}" for name, value in fields]
    raw = "\r\n".join(lines).encode()
    ours = parse_request_head(raw)
    if ours is None:
        return  # declined: aiohttp's to judge, whatever it decides
    theirs = aiohttp_reads(raw)
    assert theirs is not None, raw
    assert (ours.method, ours.target, dict(ours.headers), ours.keep_alive) == theirs


# The reader as it was before it was tuned for speed, unchanged but for its names and
# a tuple for a result: the reference the fast one must agree with, input for input.
_REF_FIELD = re.compile(
    rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?[ \t]*"
)
_REF_REQUEST_LINE = re.compile(rb"(GET|HEAD) (/[A-Za-z0-9._~!$&'()*+,;=:@/-]*) HTTP/1\.1")
_REF_FRAMING = frozenset({"transfer-encoding", "upgrade", "expect", "te", "trailer"})


class _RefHeaders(dict[str, str]):
    __slots__ = ()

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


def reference_reads(head: bytes) -> tuple[str, str, dict[str, str], bool] | None:
    if len(head) > MAX_REQUEST_HEAD_BYTES:
        return None
    lines = head.split(b"\r\n")
    if len(lines) > MAX_FIELDS + 1 or len(lines[0]) > MAX_REQUEST_LINE_BYTES:
        return None
    line = _REF_REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        return None
    headers = _RefHeaders()
    for raw in lines[1:]:
        field = _REF_FIELD.fullmatch(raw)
        if field is None:
            return None
        name = field[1].decode("ascii").lower()
        if name in headers or name in _REF_FRAMING:
            return None
        headers[name] = (field[2] or b"").decode("ascii")
    if "host" not in headers or headers.get("content-length", "0") != "0":
        return None
    connection = (headers.get("connection") or "").lower()
    options = {o.strip() for o in connection.split(",")} if connection else set()
    if "upgrade" in options:
        return None
    return line[1].decode("ascii"), line[2].decode("ascii"), dict(headers), "close" not in options


def fast_reads(head: bytes) -> tuple[str, str, dict[str, str], bool] | None:
    ours = parse_request_head(head)
    if ours is None:
        return None
    assert type(ours.headers) is Headers
    return ours.method, ours.target, dict(ours.headers), ours.keep_alive


# Well-formed pieces, and near misses of each rule the reader has, so that heads on
# both sides of every rule come up.
_ODD = st.sampled_from([
    "", " ", "\t", ":", " :", "\r", "\n", "\x00", "\x7f", "\x80", "\xe9", "\xff", "%2e", "?q",
])
# Plain tokens mostly: a second Host, or a framing field, refuses the whole head.
_NAME = st.one_of(
    TOKEN, TOKEN, TOKEN,
    st.sampled_from(["Host", "HOST", "host", "Content-Length", "content-length",
                     "Connection", "CONNECTION", "Transfer-Encoding", "Upgrade", "TE", "Te",
                     "Expect", "Trailer", "Range", "X-Request-Id"]),
)
_FIELD_VALUE = st.one_of(
    VALUE,
    st.sampled_from(["0", "00", " 0 ", "5", "close", "Close", "keep-alive", "upgrade",
                     "keep-alive, Upgrade", "close ,x", " , ", ",", "\t \t"]),
)
_SEPARATOR = st.sampled_from([":", ": ", ":\t", ": \t"])
_LINE_BREAK = st.just("\r\n")
_CLEAN_FIELDS = st.lists(st.tuples(_LINE_BREAK, _NAME, _SEPARATOR, _FIELD_VALUE), max_size=8,
                         unique_by=lambda field: field[1].lower())
_FIELDS = st.one_of(
    _CLEAN_FIELDS,
    _CLEAN_FIELDS,
    st.lists(st.tuples(
        st.sampled_from(["\r\n"] * 8 + ["\n", "\r", "\r\n\r\n", "\r\n ", "\r\n\t"]),
        st.one_of(_NAME, st.tuples(TOKEN, _ODD, TOKEN).map("".join)),
        st.sampled_from([":", ": ", ":\t", " :", ": \t", ""]),
        st.one_of(_FIELD_VALUE, st.tuples(VALUE, _ODD, VALUE).map("".join)),
    ), max_size=8),
)
_VALID_REQUEST = st.tuples(
    st.sampled_from(["GET", "HEAD"]), st.lists(SEGMENT, max_size=4).map("/".join)
).map(lambda r: f"{r[0]} /objects/{r[1]} HTTP/1.1")
_REQUEST = st.one_of(
    _VALID_REQUEST,
    _VALID_REQUEST,
    st.tuples(
        st.sampled_from(["GET", "HEAD", "POST", "get", "GET "]),
        st.sampled_from([" /", " /objects/", "  /", " http://h/", " "]),
        st.lists(SEGMENT, max_size=4).map("/".join),
        _ODD,
        st.sampled_from([" HTTP/1.1", " HTTP/1.0", " HTTP/1.1 ", "HTTP/1.1", " http/1.1"]),
    ).map("".join),
)


@settings(max_examples=500, deadline=None)
@given(
    request=_REQUEST,
    host=st.sampled_from(["\r\nHost: h", "\r\nhost:h ", "\r\nHOST:\t127.0.0.1:8080", ""]),
    fields=_FIELDS,
    connection=st.sampled_from(["", "close", "Keep-Alive", " Close ,x", "upgrade", ",", " \t"]),
)
def test_it_reads_whatever_the_reference_reads_the_same(
    request: str, host: str, fields: list[tuple[str, str, str, str]], connection: str
) -> None:
    text = request + host + "".join(map("".join, fields))
    if connection:
        text += "\r\nConnection: " + connection
    raw = text.encode("latin-1")
    assert fast_reads(raw) == reference_reads(raw), raw


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200))
def test_it_agrees_with_the_reference_on_any_bytes(raw: bytes) -> None:
    for head in (raw, b"GET / HTTP/1.1\r\nHost: h\r\n" + raw, b"GET / HTTP/1.1\r\nHost: " + raw):
        assert fast_reads(head) == reference_reads(head), head


def _fill(size: int) -> bytes:
    head = b"GET / HTTP/1.1\r\nHost: h\r\nX: "
    return head + b"v" * (size - len(head))


@pytest.mark.parametrize("head", [
    b"GET /" + b"a" * (MAX_REQUEST_LINE_BYTES - 14) + b" HTTP/1.1\r\nHost: x",
    b"GET /" + b"a" * (MAX_REQUEST_LINE_BYTES - 13) + b" HTTP/1.1\r\nHost: x",
    b"GET /a HTTP/1.1\r\nHost: x" + b"".join(b"\r\nX-%d: v" % i for i in range(MAX_FIELDS - 1)),
    b"GET /a HTTP/1.1\r\nHost: x" + b"".join(b"\r\nX-%d: v" % i for i in range(MAX_FIELDS)),
    _fill(MAX_REQUEST_HEAD_BYTES),
    _fill(MAX_REQUEST_HEAD_BYTES + 1),
    b"GET /a HTTP/1.1\r\nHost: x\r\nX:" + b" " * 5000 + b"\x00",
    b"GET /a HTTP/1.1\r\nHost: x\r\nX: a" + b" \t" * 5000,
    b"GET /a HTTP/1.1\r\nHost: x\r\nX: a\r\r\nY: b",
    b"GET /a HTTP/1.1\r\nHost: x\r\n",
    b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close",
    b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: \t",
])
def test_it_agrees_with_the_reference_at_the_limits(head: bytes) -> None:
    assert fast_reads(head) == reference_reads(head)


@given(name=st.sampled_from(["Range", "If-Match", "X-Request-Id", "host", "HOST", "Nope"]),
       value=VALUE)
def test_headers_ignore_case_like_the_reference(name: str, value: str) -> None:
    ours, ref = Headers(range=value, host="h"), _RefHeaders(range=value, host="h")
    for key in (name, name.lower(), name.upper(), name.swapcase()):
        assert (ours.get(key), ours.get(key, "d"), key in ours) == (
            ref.get(key), ref.get(key, "d"), key in ref)
        assert _item(ours, key) == _item(ref, key)
    not_a_name: object = 1
    assert not_a_name not in ours and not_a_name not in ref


def _item(headers: dict[str, str], name: str) -> str | None:
    try:
        return headers[name]
    except KeyError:
        return None


# ---------------------------------------------------------------------------
# RequestScreen: what passes to aiohttp's parser, and what it refuses first

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
CLOSE = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def screened(*reads: bytes) -> tuple[bytes, type[ProtocolError] | None]:
    """Everything the screen passes of ``reads`` (fed one at a time), and the kind of
    the error it found, if any."""
    screen = RequestScreen()
    passed, error = b"", None
    for data in reads:
        out, found = screen.receive(data)
        passed += out
        if found is not None:
            assert error is None, "a second error"
            error = type(found)
    return passed, error


@pytest.mark.parametrize("reads, passed, error", [
    # plain and pipelined requests pass whole, whatever the read boundaries
    ((GET,), GET, None),
    ((GET + GET,), GET + GET, None),
    (tuple(bytes([b]) for b in GET + GET), GET + GET, None),
    ((b"\r\n" + GET,), b"\r\n" + GET, None),
    # RFC 9112 §9.6: nothing after the request that closes the connection
    ((GET + CLOSE + GET,), GET + CLOSE, None),
    ((GET + CLOSE, GET), GET + CLOSE, None),
    ((b"GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.0\r\n\r\n",), b"GET /a HTTP/1.0\r\n\r\n", None),
    ((b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + GET,),
     b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + GET, None),
    # bodies are framed, so the request after them is screened too
    ((b"POST /p HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nBREW!GET",),
     b"POST /p HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nBREW!", None),
    ((b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", b"cdeBREW / HTTP/1.1\r\n\r\n"),
     b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde", UnknownMethod),
    ((b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      b"5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n" + GET,),
     b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
     b"5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n", None),
    # unknown methods (RFC 9110 §15.6.2), as soon as they cannot become a known one
    ((b"BREW /pot HTTP/1.1\r\n\r\n",), b"", UnknownMethod),
    ((b"get / HTTP/1.1\r\n\r\n",), b"", UnknownMethod),
    ((b"GETX",), b"", UnknownMethod),
    ((b"PROPFIND / HTTP/1.1\r\n\r\n",), b"", UnknownMethod),
    ((GET + b"BREW / HTTP/1.1\r\n\r\n" + GET,), GET, UnknownMethod),
    # versions other than 1.x (RFC 9110 §15.6.6), the version read before the method
    ((b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",), b"", UnsupportedVersion),
    ((b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",), b"", UnsupportedVersion),
    ((b"GET / HTTP/0.9\r\n\r\n",), b"", UnsupportedVersion),
    ((GET + b"GET / HTTP/3.0\r\n\r\n",), GET, UnsupportedVersion),
    # what cannot start a request line is refused at once, not at a line end
    ((bytes.fromhex("16030100a5010000a10303"),), b"", MalformedRequest),
    ((b"\x00\x00",), b"", MalformedRequest),
    ((b"G\x7fT / HTTP/1.1\r\n",), b"", MalformedRequest),
    ((b" / HTTP/1.1\r\n\r\n",), b"", MalformedRequest),
    # an incomplete request line waits
    ((b"GE",), b"", None),
    ((b"GET /objects/ds/a.bin HTT",), b"", None),
    # what it cannot frame for certain goes on unscreened, for the parser to judge
    ((b"GET / HTTP/1.1\nHost: x\n\nBREW / HTTP/1.1\r\n\r\n",),
     b"GET / HTTP/1.1\nHost: x\n\nBREW / HTTP/1.1\r\n\r\n", None),
    ((b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nBREW",),
     b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nBREW", None),
    ((b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nBREW",),
     b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nBREW", None),
    ((b"GET / HTTP/1.x\r\n\r\nBREW",), b"GET / HTTP/1.x\r\n\r\nBREW", None),
])
def test_the_screen_passes_requests_and_refuses_what_the_parser_gets_wrong(
    reads: tuple[bytes, ...], passed: bytes, error: type[ProtocolError] | None
) -> None:
    assert screened(*reads) == (passed, error)


def test_after_a_refusal_nothing_passes() -> None:
    screen = RequestScreen()
    assert screen.receive(b"BREW / HTTP/1.1\r\n\r\n")[1] is not None
    assert screen.receive(GET) == (b"", None)


def test_a_fast_path_start_is_told_apart_from_anything_else() -> None:
    for start in (b"", b"G", b"GET", b"GET /", b"GET /objects/a", b"HEA", b"HEAD /x"):
        assert could_start_plain_read(start), start
    for start in (b"P", b"POST /", b"GET  /", b"get /", b"\x16\x03\x01", b"\r\nGET /", b"HEAD *"):
        assert not could_start_plain_read(start), start


PIECES = [
    GET, CLOSE, b"\r\n", b"POST /p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"BREW / HTTP/1.1\r\n\r\n", b"GET / HTTP/2.0\r\n\r\n", b"\x16\x03\x01\x00",
    b"GET / HTTP/1.0\r\n\r\n", b"GET / HTTP/1.1\nHost: x\n\n",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=6), st.data())
def test_the_screen_passes_the_same_bytes_however_they_are_read(
    pieces: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    whole, split = screened(stream), screened(*[r for r in reads if r])
    # Which error may differ (an incomplete "BREW" is refused before its version is
    # read), not what passes nor whether one was found.
    assert (split[0], split[1] is None) == (whole[0], whole[1] is None)
