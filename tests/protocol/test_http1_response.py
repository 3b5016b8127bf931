"""The hub connection's response-head reader: what it reads, it reads as aiohttp's own
response parser does; what is not a plain HTTP/1.x head it refuses, with a reason."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from aiohttp.http_parser import HttpResponseParserPy
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import MalformedResponse
from protocol.http1 import MAX_RESPONSE_HEAD_BYTES, ResponseHead, parse_response_head
from tests.protocol.aiohttp_reference import first_message


@dataclass(frozen=True)
class Read:
    """What a parser made of a head: each field's value as the bytes it came from
    (we decode latin-1, aiohttp UTF-8 with surrogates: the same bytes either way)."""

    status: int
    headers: dict[str, bytes]
    keep_alive: bool
    content_length: int | None


def aiohttp_reads(head: bytes) -> Read | None:
    """What aiohttp's pure-Python response parser makes of ``head``; None if it refuses it.

    Its limits are raised out of the way: the comparison is about meaning. The hub
    connection takes heads up to MAX_RESPONSE_HEAD_BYTES, longer than aiohttp's lines.
    """

    msg = first_message(lambda proto, loop: HttpResponseParserPy(
        proto, loop, 2**20, max_line_size=2**20, max_field_size=2**20, max_headers=2**16), head)
    if msg is None:
        return None
    headers: dict[str, list[str]] = {}
    for name, value in msg.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    joined = {k: ", ".join(v).encode("utf-8", "surrogateescape") for k, v in headers.items()}
    length = msg.headers.get("Content-Length")
    return Read(msg.code, joined, not msg.should_close,
                None if msg.chunked or length is None else int(length))


def ours(head: bytes) -> Read:
    parsed = parse_response_head(head)
    return Read(parsed.status, {k: v.encode("latin-1") for k, v in parsed.headers.items()},
                parsed.keep_alive, parsed.content_length)


CHUNK = (b"HTTP/1.1 206 Partial Content\r\nContent-Type: application/octet-stream\r\n"
         b'Content-Range: bytes 0-9/20\r\nContent-Length: 10\r\nETag: "v1"\r\n'
         b"Date: Tue, 01 Dec 2026 12:00:00 GMT\r\nServer: hubspoke")


def test_a_hub_206_is_read_like_aiohttp() -> None:
    head = parse_response_head(CHUNK)
    assert head == ResponseHead(206, {
        "content-type": "application/octet-stream", "content-range": "bytes 0-9/20",
        "content-length": "10", "etag": '"v1"', "date": "Tue, 01 Dec 2026 12:00:00 GMT",
        "server": "hubspoke",
    }, keep_alive=True, content_length=10)
    assert ours(CHUNK) == aiohttp_reads(CHUNK)


# (head, status, keep_alive, content_length, a field and its value)
READ_CASES: list[tuple[bytes, int, bool, int | None, tuple[str, str] | None]] = [
    # status lines: a reason, none, an empty one, any later 1.x minor version
    (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 3", 206, True, 3, None),
    (b"HTTP/1.1 206\r\nContent-Length: 3", 206, True, 3, None),
    (b"HTTP/1.1 404 \r\nContent-Length: 0", 404, True, 0, None),
    (b"HTTP/1.1 503 Service\tUnavailable \xe9\r\nContent-Length: 0", 503, True, 0, None),
    (b"HTTP/1.9 200 OK\r\nContent-Length: 0", 200, True, 0, None),
    # keep-alive (RFC 9112 §9.3): 1.1 persists unless "close"; 1.0 only with "keep-alive"
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nConnection: close", 206, False, 0, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive, CLOSE", 206, False, 0,
     None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nConnection: x-close", 206, True, 0, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nConnection: keep-alive", 206, True, 0, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nConnection: ,", 206, True, 0, None),
    (b"HTTP/1.0 206 OK\r\nContent-Length: 0", 206, False, 0, None),
    (b"HTTP/1.0 206 OK\r\nContent-Length: 0\r\nConnection: keep-alive", 206, True, 0, None),
    (b"HTTP/1.0 206 OK\r\nContent-Length: 0\r\nConnection: keep-alive, close", 206, False, 0,
     None),
    # framing: only one plain Content-Length frames a body this reader takes
    (b"HTTP/1.1 206 OK\r\nContent-Length: 007", 206, True, 7, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: " + b"9" * 18, 206, True, 10**18 - 1, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: " + b"1" * 19, 206, True, None, None),
    (b"HTTP/1.1 206 OK", 206, True, None, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: +5", 206, True, None, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: 5 5", 206, True, None, None),
    (b"HTTP/1.1 206 OK\r\nContent-Length: \xb2", 206, True, None, None),  # '²'.isdigit()
    (b"HTTP/1.1 206 OK\r\nContent-Length: 5\r\nContent-Length: 5", 206, True, None,
     ("content-length", "5, 5")),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", 200, True, None, None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3", 200, True, None,
     None),
    # fields: names by lower case, OWS around values dropped, repeats joined
    (b'HTTP/1.1 206 OK\r\nETAG:  "e" \t\r\nContent-Length: 0', 206, True, 0, ("etag", '"e"')),
    (b"HTTP/1.1 206 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0", 206, True, 0, ("x-a", "1, 2")),
    (b"HTTP/1.1 206 OK\r\nX-Empty:\r\nContent-Length: 0", 206, True, 0, ("x-empty", "")),
    (b'HTTP/1.1 206 OK\r\nX: caf\xe9 "q"\r\nContent-Length: 0', 206, True, 0, ("x", 'café "q"')),
]


@pytest.mark.parametrize(("head", "status", "keep_alive", "length", "field"), READ_CASES)
def test_read(
    head: bytes, status: int, keep_alive: bool, length: int | None,
    field: tuple[str, str] | None,
) -> None:
    parsed = parse_response_head(head)
    assert (parsed.status, parsed.keep_alive, parsed.content_length) == (
        status, keep_alive, length)
    if field is not None:
        assert parsed.headers[field[0]] == field[1]
    if length is not None:
        assert ours(head) == aiohttp_reads(head)


def _fill(size: int) -> bytes:
    head = b"HTTP/1.1 206 OK\r\nContent-Length: 0\r\nX: "
    return head + b"v" * (size - len(head))


# (head, what the error says)
REFUSED_CASES: list[tuple[bytes, str]] = [
    (b"", "status line"),
    (b"HTTP/2 206 OK", "status line"),
    (b"HTTP/2.0 206 OK", "status line"),
    (b"HTTP/1. 206 OK", "status line"),
    (b"http/1.1 206 OK", "status line"),
    (b"ICY 200 OK", "status line"),
    (b"HTTP/1.1 20 OK", "status line"),
    (b"HTTP/1.1 2060 OK", "status line"),
    (b"HTTP/1.1 2O6 OK", "status line"),
    (b"HTTP/1.1 \xb206 OK", "status line"),  # '²06'.isdigit()
    (b"HTTP/1.1  206 OK", "status line"),
    (b" HTTP/1.1 206 OK", "status line"),
    (b"HTTP/1.1 206 O\x00K", "status line"),
    (b"HTTP/1.1 206 OK\rX: y", "status line"),
    (b"\r\nHTTP/1.1 206 OK", "status line"),
    (b"HTTP/1.1 206 OK\nContent-Length: 0", "status line"),  # bare LF
    (b"HTTP/1.1 206 OK\r\nContent-Length: 0\nX: y", "header"),
    (b"HTTP/1.1 206 OK\r\nX: a\rb", "header"),
    (b"HTTP/1.1 206 OK\r\nX: a\x00b", "header"),
    (b"HTTP/1.1 206 OK\r\nX: a\x7f", "header"),
    (b"HTTP/1.1 206 OK\r\nX: a\r\n folded", "header"),  # obs-fold (RFC 9112 §5.2)
    (b"HTTP/1.1 206 OK\r\nX: a\r\n\tfolded", "header"),
    (b"HTTP/1.1 206 OK\r\nX : a", "header"),  # whitespace before the colon (§5.1)
    (b"HTTP/1.1 206 OK\r\n X: a", "header"),
    (b"HTTP/1.1 206 OK\r\nBad Name: a", "header"),
    (b"HTTP/1.1 206 OK\r\n: a", "header"),
    (b"HTTP/1.1 206 OK\r\nNoColon", "header"),
    (b"HTTP/1.1 206 OK\r\nContent-Length", "header"),  # a name it knows, and no colon
    (b"HTTP/1.1 206 OK\r\nX\xe9: a", "header"),
    (b"HTTP/1.1 206 OK\r\n", "header"),
    (b"HTTP/1.1 206 OK\r\nX: a\r\n\r\nY: b", "header"),
    (_fill(MAX_RESPONSE_HEAD_BYTES + 1), f"over {MAX_RESPONSE_HEAD_BYTES} bytes"),
]


@pytest.mark.parametrize(("head", "says"), REFUSED_CASES)
def test_refused(head: bytes, says: str) -> None:
    with pytest.raises(MalformedResponse, match=says):
        parse_response_head(head)


def test_a_head_of_the_limit_is_read() -> None:
    head = _fill(MAX_RESPONSE_HEAD_BYTES)
    assert parse_response_head(memoryview(head)) == parse_response_head(bytearray(head))
    assert ours(head) == aiohttp_reads(head)


TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_.!#$%&'*+^`|~", min_size=1,
                max_size=12)
VALUE = st.text("".join(chr(c) for c in range(0x20, 0x7F)) + "\t\xe9\xff", max_size=30)
_ODD = st.sampled_from([
    "", " ", "\t", ":", " :", "\r", "\n", "\r\n ", "\x00", "\x01", "\x7f", "\x80", "\xb2",
])
_NAME = st.one_of(
    TOKEN, TOKEN,
    st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH", "Connection",
                     "Transfer-Encoding", "ETag", "Content-Range", "Keep-Alive"]),
    st.tuples(TOKEN, _ODD, TOKEN).map("".join),
)
_FIELD_VALUE = st.one_of(
    VALUE,
    st.sampled_from(["0", "10", "007", " 5 ", "+5", "5,5", "chunked", "gzip, chunked", "close",
                     "Close", "keep-alive", "keep-alive, close", " , ", "x-close", "\t"]),
    st.tuples(VALUE, _ODD, VALUE).map("".join),
)
_STATUS = st.one_of(
    st.tuples(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]), st.sampled_from(["200", "206", "404"]),
              st.sampled_from(["", " ", " OK", " Partial Content"])).map(
        lambda s: f"{s[0]} {s[1]}{s[2]}"),
    st.tuples(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.9", "HTTP/2.0", "HTTP/1.",
                               "http/1.1", ""]),
              st.sampled_from([" ", "  ", "", "\t"]),
              st.sampled_from(["206", "20", "2060", "\xb206", "099", ""]),
              st.one_of(st.just(""), st.tuples(_ODD, VALUE).map("".join))).map("".join),
)
_CLEAN_FIELDS = st.lists(st.tuples(
    st.just("\r\n"),
    st.one_of(TOKEN, st.sampled_from(["Connection", "ETag", "Content-Range", "Keep-Alive"])),
    st.sampled_from([":", ": ", ":\t", ": \t"]),
    st.one_of(VALUE, st.sampled_from(["close", "Close", "keep-alive", "keep-alive, close", ","])),
), max_size=8)
_FIELDS = st.one_of(
    _CLEAN_FIELDS,
    _CLEAN_FIELDS,
    st.lists(st.tuples(
        st.sampled_from(["\r\n"] * 12 + ["\n", "\r", "\r\n ", "\r\n\t", "\r\n\r\n"]),
        _NAME,
        st.sampled_from([":", ": ", ":\t", ": \t", " :", ""]),
        _FIELD_VALUE,
    ), max_size=8),
)
# Mostly one plain Content-Length, somewhere among the fields: the heads the hub sends.
_LENGTH_FIELD = st.one_of(
    st.integers(0, 10**18).map(lambda n: f"\r\nContent-Length: {n}"),
    st.integers(0, 10**18).map(lambda n: f"\r\ncontent-length:\t{n} "),
    st.just(""),
)


@settings(max_examples=500, deadline=None)
@given(status=_STATUS, fields=_FIELDS, length=_LENGTH_FIELD, at=st.integers(0, 8))
def test_whatever_it_reads_aiohttp_reads_the_same(
    status: str, fields: list[tuple[str, str, str, str]], length: str, at: int
) -> None:
    lines = list(map("".join, fields))
    lines.insert(at, length)
    raw = (status + "".join(lines)).encode("latin-1")
    try:
        read = ours(raw)
    except MalformedResponse:
        return  # refused: the hub connection gives up on it, whatever aiohttp would do
    if read.content_length is None:
        return  # framed some other way: the hub connection hands the answer to aiohttp
    assert aiohttp_reads(raw) == read, raw


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200))
def test_on_any_bytes_it_reads_like_aiohttp_or_refuses(raw: bytes) -> None:
    for head in (raw, b"HTTP/1.1 206 OK\r\nContent-Length: 1\r\n" + raw,
                 b"HTTP/1.1 206 OK\r\nContent-Length: " + raw):
        try:
            read = ours(head)
        except MalformedResponse:
            continue
        if read.content_length is not None:
            assert aiohttp_reads(head) == read, head
