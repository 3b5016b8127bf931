"""The fast path's request-head reader: what it takes, it reads exactly as aiohttp does;
everything else it declines (None), for aiohttp to judge."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.http_parser import HttpRequestParserPy
from hypothesis import given
from hypothesis import strategies as st

from protocol.http1 import MAX_FIELDS, parse_request_head


def aiohttp_reads(head: bytes) -> tuple[str, str, dict[str, str], bool] | None:
    """What aiohttp's own (pure-Python) parser makes of ``head``; None if it refuses it."""

    class Proto:
        def set_response_params(self, *a: object, **k: object) -> None: ...

    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParserPy(Proto(), loop, 2**16, max_line_size=8190,  # type: ignore[arg-type]
                                     max_field_size=8190)
        try:
            messages, _, _ = parser.feed_data(head + b"\r\n\r\n")
        except Exception:
            return None
    finally:
        loop.close()
    if not messages:
        return None
    msg = messages[0][0]
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
