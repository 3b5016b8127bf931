"""Live fuzzing of a real hub and a real spoke over raw sockets.

Requests go out byte for byte on asyncio sockets to 127.0.0.1, so no client library
normalises or refuses anything. Two parts, each run against both servers:

- crafted hostile requests: malformed request lines, headers just under and over
  the limits, thousands of ranges, overflowing numbers, invalid UTF-8 and percent-
  encoding, NUL, ``..`` in every encoding, symlinks out of the root, truncated and
  garbage bodies on the admin endpoints, bad methods, HTTP/1.0, pipelining, header
  injection;
- a seeded generator mutating valid requests byte-wise (``MUTATED_PER_SERVER`` each).

Every answer must be a 4xx, or a 2xx/3xx where the request really is valid; never a
5xx, a body cut short or a hang (every read has a deadline, and after the fuzzing no
request may still be in a handler). A server may close the connection on protocol
garbage (aiohttp answers 400, then closes). Afterwards both still serve the right
bytes. The bugs it found are pinned by the regression tests at the end.
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import functools
import json
import logging
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgpack
import pytest
from aiohttp.http_exceptions import HttpProcessingError

from hub.config import HubConfig
from service.limits import LIMIT
from spoke.app import MAX_BODY_BYTES
from spoke.config import SpokeConfig
from tests.conftest import CHUNK, SpokeFactory
from tests.security.conftest import Mint, call
from tests.support.servers import (
    Process,
    RunningServer,
    start_hub,
    start_process,
    start_spoke,
)
from tests.support.tenant_links import OWN, TO_A, files_holding_a, leaks, plant_tenant_links
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]

HOST = "127.0.0.1"
SECRET = b"FUZZ-SECRET-OUTSIDE-THE-ROOT\n"
MUTATED_PER_SERVER = 2000
SEED = 20240607
FOURXX = frozenset(range(400, 500))
# Answers about the request, not failures of the server: an unknown method (RFC 9110
# §15.6.2) and an HTTP version other than 1.x (§15.6.6).
REFUSALS = frozenset({501, 505})
OK = frozenset({200, 206})
# Request sizes at aiohttp's limits as service/runner.py configures them.
MAX_LINE = 8190
MAX_FIELD = 32 << 10
MAX_HEADERS = 128


# ---------------------------------------------------------------------------
# raw HTTP/1.1 exchanges


@dataclass
class Reply:
    status: int
    head: bytes
    body: bytes
    truncated: bool = False  # the server closed before the announced body was complete


@dataclass
class Exchange:
    payload: bytes
    replies: list[Reply] = field(default_factory=list)
    closed: bool = False  # the server closed the connection
    timed_out: bool = False  # nothing came back in time (we then sent EOF)
    seconds: float = 0.0

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.replies if r.status >= 200]


def _take_reply(buf: bytes, head_request: bool, eof: bool) -> tuple[Reply, bytes] | None:
    """The first complete response in ``buf`` and the bytes after it; None if incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        assert not (eof and buf), f"response head cut short: {buf[:200]!r}"
        return None
    head, rest = buf[:end], buf[end + 4:]
    status_line, *lines = head.split(b"\r\n")
    version, _, tail = status_line.partition(b" ")
    assert version in (b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9") and tail[:3].isdigit(), status_line
    status = int(tail[:3])
    headers = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        assert sep and name and name == name.strip(), f"bad response header line {line!r}"
        headers[name.lower()] = value.strip()
    if head_request and b"content-length" in headers:
        # A HEAD's answer has no body, unless the server answered something else (aiohttp
        # drops the valid requests before a parse error, and answers that with a body).
        if rest.startswith(b"HTTP/") or (eof and not rest):
            return Reply(status, head, b""), rest
        if not rest or b"HTTP/".startswith(rest):
            return None
    elif status < 200 or status in (204, 304) or head_request:
        return Reply(status, head, b""), rest
    if b"content-length" in headers:
        size = int(headers[b"content-length"])
        if len(rest) < size:
            return (Reply(status, head, rest, truncated=True), b"") if eof else None
        return Reply(status, head, rest[:size]), rest[size:]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, pos = b"", 0
        while True:
            line_end = rest.find(b"\r\n", pos)
            if line_end < 0:
                return (Reply(status, head, body, truncated=True), b"") if eof else None
            size = int(rest[pos:line_end].split(b";")[0], 16)
            if size == 0:
                trailer_end = rest.find(b"\r\n\r\n", line_end)
                if trailer_end < 0:
                    return (Reply(status, head, body, truncated=True), b"") if eof else None
                return Reply(status, head, body), rest[trailer_end + 4:]
            if len(rest) < line_end + 2 + size + 2:
                return (Reply(status, head, body, truncated=True), b"") if eof else None
            body += rest[line_end + 2:line_end + 2 + size]
            pos = line_end + 2 + size + 2
    return (Reply(status, head, rest), b"") if eof else None  # delimited by the close


MID_ANSWER_WAIT_S = 15.0
# The head of an answer to a HEAD, and nothing after it: the answer whole, or (aiohttp
# answering a parse error after the HEAD instead) a head whose body is written with it.
# On a kept-alive connection no close follows either, so past this wait we send EOF and
# read what the server sent before its close.
HEAD_ANSWER_WAIT_S = 2.0


async def exchange(port: int, payload: bytes, *, wait: float = 2.0, idle: float = 0.05,
                   pieces: list[tuple[float, bytes]] | None = None) -> Exchange:
    """Send ``payload`` (then each ``(delay, bytes)`` of ``pieces``), read the answers.

    Reading stops when the server closes, or ``idle`` seconds after the last complete
    final answer. When nothing at all comes back within ``wait`` seconds (the server is
    waiting for the rest of a request, or hangs), we send EOF, after which the server
    must close within 5 s.
    """
    started = time.monotonic()
    result = Exchange(payload)
    # Which of the (pipelined) requests are HEADs, whose answers have no body; a guess
    # from the bytes, good enough for what we send.
    heads = [piece.startswith(b"HEAD ") for piece in payload.split(b"\r\n\r\n")]

    def head_request() -> bool:
        answered = sum(r.status >= 200 for r in result.replies)
        return answered < len(heads) and heads[answered]

    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        with suppress(ConnectionError):
            writer.write(payload)
            await writer.drain()
            for delay, piece in pieces or []:
                await asyncio.sleep(delay)
                writer.write(piece)
                await writer.drain()
        buf = b""
        while True:
            answered = any(r.status >= 200 for r in result.replies) and not buf
            # Part of an answer in hand: the server is sending, not waiting for us; a busy
            # machine (the whole suite at once) may take seconds to go on.
            head_answer = (bool(buf) and head_request() and b"\r\n\r\n" in buf
                           and not result.timed_out)
            timeout = (idle if answered else HEAD_ANSWER_WAIT_S if head_answer
                       else MID_ANSWER_WAIT_S if buf else wait)
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), timeout)
            except TimeoutError:
                if answered:
                    break
                assert not result.timed_out, "no answer and no close 5 s after EOF"
                result.timed_out, wait = True, 5.0
                with suppress(OSError):
                    writer.write_eof()
                continue
            except ConnectionError:
                data = b""
            if not data:
                result.closed = True
                break
            buf += data
            while (taken := _take_reply(buf, head_request(), eof=False)) is not None:
                reply, buf = taken
                result.replies.append(reply)
        while buf and (taken := _take_reply(buf, head_request(), eof=True)) is not None:
            reply, buf = taken
            result.replies.append(reply)
    finally:
        writer.close()
        with suppress(Exception):
            await writer.wait_closed()
    result.seconds = time.monotonic() - started
    return result


def request(target: bytes, *, method: bytes = b"GET", headers: bytes = b"", body: bytes = b"",
            version: bytes = b"HTTP/1.1", close: bool = True) -> bytes:
    """A request, byte for byte (``headers``: complete ``Name: value\\r\\n`` lines)."""
    return (method + b" " + target + b" " + version + b"\r\nHost: fuzz\r\n" + headers
            + (b"Connection: close\r\n" if close else b"") + b"\r\n" + body)


def post(target: bytes, body: bytes, content_type: bytes = b"application/json",
         extra: bytes = b"") -> bytes:
    headers = (b"Content-Type: " + content_type + b"\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n" + extra)
    return request(target, method=b"POST", headers=headers, body=body)


# ---------------------------------------------------------------------------
# servers and their data


@dataclass
class Target:
    kind: str  # "hub" | "spoke"
    server: RunningServer
    port: int
    files: dict[str, bytes]
    root: Path


@pytest.fixture(params=["hub", "spoke"])
async def target(request: pytest.FixtureRequest, dataset: Dataset, hub: RunningServer,
                 make_spoke: SpokeFactory) -> Target:
    root, files = dataset
    server = hub if request.param == "hub" else await make_spoke()
    plant_hostile_files(root)
    return Target(request.param, server, int(server.url.rsplit(":", 1)[1]), files, root)


ESCAPING_LINKS = ("ds/link-out.bin", "ds/abs-out.bin", "ds/etc-passwd", "escape-dir/secret.txt")


def plant_hostile_files(root: Path) -> None:
    """A secret next to the root, and symlinks in the root pointing out of it and around."""
    secret = root.parent / "secret.txt"
    secret.write_bytes(SECRET)
    (root / "ds" / "link-out.bin").symlink_to("../../secret.txt")  # relative, escaping
    (root / "ds" / "abs-out.bin").symlink_to(secret)  # absolute, escaping
    (root / "ds" / "etc-passwd").symlink_to("/etc/passwd")
    (root / "escape-dir").symlink_to(root.parent, target_is_directory=True)
    (root / "ds" / "dangling.bin").symlink_to("nowhere.bin")
    (root / "ds" / "alias.bin").symlink_to("small.bin")  # inside the root
    os.mkfifo(root / "ds" / "fifo.bin")  # opening it must not block the server


def check_invariants(ex: Exchange) -> list[str]:
    """What is wrong with any answer to any request, whatever was sent."""
    problems = []
    for reply in ex.replies:
        if reply.status >= 500 and reply.status not in REFUSALS:
            problems.append(f"{reply.status} answer")
        if reply.truncated:
            problems.append(f"{reply.status} answer cut short ({len(reply.body)} body bytes)")
        if SECRET in reply.body or b"root:x:0:0" in reply.body:
            problems.append("bytes from outside the root")
        for line in reply.head.split(b"\r\n")[1:]:
            name = line.partition(b":")[0].strip().lower()
            if name in (b"set-cookie", b"x-injected"):
                problems.append(f"injected response header {line!r}")
    return problems


async def healthy_and_correct(target: Target) -> None:
    """A normal client gets the right bytes of ranged and whole reads."""
    big, small = target.files["ds/big.bin"], target.files["ds/small.bin"]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{target.server.url}/objects/ds/big.bin",
                            headers={"Range": "bytes=65000-200000"}) as resp:
            assert resp.status == 206
            assert resp.headers["Content-Range"] == f"bytes 65000-200000/{len(big)}"
            assert await resp.read() == big[65000:200001]
        async with http.get(f"{target.server.url}/objects/ds/big.bin",
                            headers={"Range": "bytes=-1000"}) as resp:
            assert resp.status == 206 and await resp.read() == big[-1000:]
        async with http.get(f"{target.server.url}/objects/ds/small.bin") as resp:
            assert resp.status == 200 and await resp.read() == small
        async with http.get(f"{target.server.url}/healthz") as resp:
            assert resp.status == 200


async def no_request_left_in_a_handler(target: Target) -> None:
    """A hang in our code leaves a request in flight after its client has gone."""
    await no_request_left_in_a_handler_of(target.server)


async def no_request_left_in_a_handler_of(server: RunningServer) -> None:
    limit = server.app[LIMIT]
    for _ in range(250):
        if not limit.in_flight():
            break
        await asyncio.sleep(0.02)
    assert limit.in_flight() == 0, f"{limit.in_flight()} requests still in a handler"


@pytest.fixture
def server_errors(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """Errors the servers logged that are not aiohttp's own rejection of a bad request."""
    caplog.set_level(logging.ERROR)

    def expected(record: logging.LogRecord) -> bool:
        # aiohttp's parser refusing a request, or a client gone in the middle of one.
        error = record.exc_info[1] if record.exc_info else None
        return record.name == "aiohttp.server" and isinstance(
            error, HttpProcessingError | ConnectionResetError)

    def unexpected() -> list[str]:
        return [
            f"{r.name}: {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.ERROR and not expected(r)
        ]

    return unexpected


# ---------------------------------------------------------------------------
# crafted hostile requests


@dataclass(frozen=True)
class Case:
    name: str
    payload: bytes
    allowed: frozenset[int] = FOURXX  # what a final answer may be
    answered: bool | None = True  # at least one answer (None: either way)
    count: int | None = None  # exactly this many final answers
    body: bytes | None = None  # the only body a 2xx answer may carry
    forbidden: tuple[bytes, ...] = ()  # what no answer may contain
    empty_listing: bool = False  # a 200 listing, if any, lists nothing
    wait: float = 2.0
    pieces: tuple[tuple[float, bytes], ...] = ()


def _objects(path: bytes, allowed: frozenset[int] = frozenset({400, 404}),
             name: str = "") -> list[Case]:
    return [Case(name or f"GET /objects/{path!r}", request(b"/objects/" + path), allowed)]


DOTDOT = [
    b"..", b"../secret.txt", b"ds/../../secret.txt", b"ds/../small.bin",
    b"%2e%2e/secret.txt", b"%2E%2e/secret.txt", b".%2e/secret.txt", b"%2e./secret.txt",
    b"%252e%252e/secret.txt", b"%25252e%25252e/secret.txt", b"%2525252e%2525252e/secret.txt",
    b"%c0%ae%c0%ae/secret.txt", b"%e0%80%ae%e0%80%ae/secret.txt", b"%c0%2e%c0%2e/secret.txt",
    b"\xc0\xae\xc0\xae/secret.txt", b"%ef%bc%8e%ef%bc%8e/secret.txt", b"%u002e%u002e/secret.txt",
    b"..%2fsecret.txt", b"..%2Fsecret.txt", b"..%252fsecret.txt", b"..%c0%afsecret.txt",
    b"..%5csecret.txt", b"..%255csecret.txt", b"..\\secret.txt", b"ds\\..\\..\\secret.txt",
    b"%2e%2e%5csecret.txt", b"%2e%2e\\secret.txt", b"ds/%2e%2e/%2e%2e/secret.txt",
    b"ds/.%2e/..%2f..%2fsecret.txt", b"ds/%2e%2e%2f%2e%2e%2fsecret.txt", b"..;/secret.txt",
    b"ds/..%00/secret.txt", b"%%32%65%%32%65/secret.txt", b"%252E%252E%252Fsecret.txt",
    b"./ds/small.bin", b"ds/./small.bin", b"ds/%2e/small.bin", b"ds/small.bin/..",
    b"ds/small.bin/%2e%2e", b"/secret.txt", b"//secret.txt", b"%2fetc%2fpasswd",
    b"%2F%2e%2e%2Fsecret.txt", b"ds//small.bin", b"ds/small.bin/",
    b"ds/..../small.bin", b"...",
]
BAD_BYTES = [
    b"ds/\xff\xfe.bin", b"ds/\xc3.bin", b"ds/\xed\xa0\x80.bin", b"ds/\xc0\xaf.bin",
    b"ds/%ff%fe.bin", b"ds/%c3.bin", b"ds/%ed%a0%80.bin", b"ds/%c0%af.bin", b"ds/%e0%80%af.bin",
    b"ds/%.bin", b"ds/%g0.bin", b"ds/%2.bin", b"ds/%%.bin", b"ds/%%2e.bin", b"ds/%zz",
    b"ds/small.bin%", b"ds/small.bin%2",
    b"ds/\x00", b"ds/small.bin\x00", b"ds/small.bin%00", b"ds/small.bin%00.txt", b"%00",
    b"ds/small.bin%2500", b"ds/small%01.bin", b"ds/small%7f.bin", b"ds/small\x7f.bin",
    b"ds/small\x01.bin", b"ds/small.bin%0d%0aSet-Cookie:%20x=1",
    b"ds/small.bin%0d%0aX-Injected:%201", b"ds/" + b"x" * 300, b"a/" * 600 + b"b",
    b"ds/" + b"%41" * 2000,
]


def crafted_cases(target: Target) -> list[Case]:
    big = target.files["ds/big.bin"]
    small = target.files["ds/small.bin"]
    cases: list[Case] = []
    add = cases.append

    # malformed request lines
    for name, payload in [
        ("bare CRLFs", b"\r\n\r\n\r\n\r\n"),
        ("method only", b"GET\r\n\r\n"),
        ("extra token", b"GET /objects/ds/small.bin HTTP/1.1 extra\r\nHost: x\r\n\r\n"),
        ("no method", b" /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("tab separated", b"GET\t/objects/ds/small.bin\tHTTP/1.1\r\nHost: x\r\n\r\n"),
        ("relative target", b"GET objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("asterisk", b"GET * HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("CONNECT", b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("bad version", b"GET /objects/ds/small.bin HTTP/1.x\r\nHost: x\r\n\r\n"),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("TLS hello", bytes.fromhex("16030100a5010000a10303") + os.urandom(160)),
        ("NULs", b"\x00" * 64 + b"\r\n\r\n"),
        ("high bytes", bytes(range(128, 256)) + b"\r\n\r\n"),
        ("DEL in method", b"G\x7fT /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("NUL in method", b"GET\x00 /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("lowercase method", request(b"/objects/ds/small.bin", method=b"get")),
        ("huge method", request(b"/objects/ds/small.bin", method=b"A" * 10000)),
        ("header without colon", request(b"/objects/ds/small.bin", headers=b"Foo\r\n")),
        ("space in header name", request(b"/objects/ds/small.bin", headers=b"Foo Bar: 1\r\n")),
        ("space before colon", request(b"/objects/ds/small.bin", headers=b"Foo : 1\r\n")),
        ("obs-fold", request(b"/objects/ds/small.bin", headers=b"Foo: 1\r\n continued\r\n")),
        ("empty header name", request(b"/objects/ds/small.bin", headers=b": 1\r\n")),
        ("bad name char", request(b"/objects/ds/small.bin", headers=b"X-A(b): 1\r\n")),
        ("NUL in value", request(b"/objects/ds/small.bin", headers=b"X-A: a\x00b\r\n")),
        ("CR in value", request(b"/objects/ds/small.bin", headers=b"X-A: a\rb\r\n")),
        ("bare CR line ends", b"GET /objects/ds/small.bin HTTP/1.1\rHost: x\r\r"),
    ]:
        add(Case(f"request line: {name}", payload, FOURXX | REFUSALS, answered=None, wait=0.5))
    for name, payload in [
        ("HTTP/0.9 (aiohttp answers as 1.1)", b"GET /objects/ds/small.bin\r\n\r\n"),
        ("HTTP/1.1 without Host",
         b"GET /objects/ds/small.bin HTTP/1.1\r\nConnection: close\r\n\r\n"),
        ("double space", b"GET  /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("two Hosts", request(b"/objects/ds/small.bin", headers=b"Host: other\r\n")),
        ("absolute-form", request(b"http://fuzz/objects/ds/small.bin")),
        ("bare LF line ends",
         b"GET /objects/ds/small.bin HTTP/1.1\nHost: x\nConnection: close\n\n"),
        ("query", request(b"/objects/ds/small.bin?a=1&b=%ff&c=%00&..=../")),
        ("fragment", request(b"/objects/ds/small.bin#frag")),
    ]:
        add(Case(f"lenient: {name}", payload, OK | FOURXX, body=small))

    # sizes just under and over the limits
    line_pad = MAX_LINE - len(b"GET /objects/ds/small.bin? HTTP/1.1") - 2
    add(Case("request line just under the limit",
             request(b"/objects/ds/small.bin?" + b"q" * line_pad), OK | {414}, body=small))
    add(Case("request line over the limit",
             request(b"/objects/ds/small.bin?" + b"q" * (MAX_LINE + 10))))
    add(Case("path of 8000 bytes", request(b"/objects/ds/" + b"p" * 8000)))
    field_pad = MAX_FIELD - len(b"X-Pad: ") - 2
    add(Case("header field just under the limit",
             request(b"/objects/ds/small.bin", headers=b"X-Pad: " + b"a" * field_pad + b"\r\n"),
             OK | {431}, body=small))
    add(Case("header field over the limit",
             request(b"/objects/ds/small.bin",
                     headers=b"X-Pad: " + b"a" * (MAX_FIELD + 10) + b"\r\n"),
             answered=None))
    add(Case("header name over the limit",
             request(b"/objects/ds/small.bin", headers=b"X" * (MAX_FIELD + 10) + b": 1\r\n"),
             answered=None))
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS - 5))
    add(Case("headers just under the count limit", request(b"/objects/ds/small.bin", headers=many),
             OK | {431}, body=small))
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS + 50))
    add(Case("headers over the count limit", request(b"/objects/ds/small.bin", headers=many),
             answered=None))
    big_headers = b"".join(b"X-H%d: " % i + b"b" * 30000 + b"\r\n" for i in range(100))
    add(Case("3 MB of headers", request(b"/objects/ds/small.bin", headers=big_headers),
             OK | {431}, body=small))

    # ranges: thousands, overflowing numbers, junk
    def ranged(spec: bytes, allowed: frozenset[int] = OK | FOURXX, path: bytes = b"ds/big.bin",
               name: str = "") -> Case:
        return Case(name or f"Range: {spec[:60]!r}",
                    request(b"/objects/" + path, headers=b"Range: " + spec + b"\r\n"), allowed)

    add(ranged(b"bytes=" + b",".join(b"%d-%d" % (i, i) for i in range(256)), OK,
               name="256 ranges"))
    add(ranged(b"bytes=" + b",".join(b"%d-%d" % (i, i) for i in range(257)), FOURXX,
               name="257 ranges"))
    add(ranged(b"bytes=" + b"0-0," * 5000, FOURXX, name="5000 ranges"))
    add(ranged(b"bytes=" + b"0-," * 20000, FOURXX, name="20000 ranges (over the field limit)"))
    add(ranged(b"bytes=" + b"," * 30000 + b"0-1", name="30000 empty elements"))
    add(ranged(b"bytes=" + b",".join(b"-%d" % (i + 1) for i in range(256)), OK,
               name="256 overlapping suffixes"))
    for spec in [
        b"bytes=99999999999999999999999999-", b"bytes=0-99999999999999999999999999",
        b"bytes=-99999999999999999999999", b"bytes=18446744073709551616-18446744073709551617",
        b"bytes=9223372036854775807-", b"bytes=9223372036854775808-9223372036854775809",
        b"bytes=0-" + b"9" * 5000, b"bytes=" + b"9" * 5000 + b"-", b"bytes=-" + b"9" * 5000,
        b"bytes=-0", b"bytes=0x10-0x20", b"bytes=1e3-2e3", b"bytes=+1-2", b"bytes=1_0-2_0",
        b"bytes=-1-2", b"bytes=5-1", b"bytes= 1 - 2 ", b"bytes=\xd9\xa1-\xd9\xa2",
        b"bytes=\xc2\xb2-\xc2\xb3", b"bytes=\x00-1", b"bytes=0-1\x00", b"bytes=--1", b"bytes=1--2",
        b"bytes=", b"bytes", b"bytes==0-1", b"items=0-1", b"BYTES=0-1", b"bytes=0-1;q=1",
        b"bytes=0-1,junk", b"\xff\xfe", b"bytes=0-1, ,,, ,2-3",
    ]:
        add(ranged(spec))
    add(ranged(b"bytes=0-0,-1", path=b"ds/empty.bin"))
    add(ranged(b"bytes=-1", path=b"ds/empty.bin"))
    add(ranged(b"bytes=1-", path=b"ds/one-byte.bin"))
    add(Case("If-Range junk", request(b"/objects/ds/big.bin", headers=(
        b"Range: bytes=0-9\r\nIf-Range: \xff\x00junk\r\n")), OK | FOURXX))
    add(Case("If-Match flood", request(b"/objects/ds/big.bin", headers=(
        b"If-Match: " + b", ".join(b'"e%d"' % i for i in range(3000)) + b"\r\n")),
        OK | FOURXX))
    add(Case("If-None-Match junk", request(b"/objects/ds/big.bin", headers=(
        b"If-None-Match: W/\"\xff\", ,,\"\r\n")), OK | FOURXX | {304}))
    add(Case("If-Modified-Since junk", request(b"/objects/ds/big.bin", headers=(
        b"If-Modified-Since: Fri, 99 Foo 99999 99:99:99 GMT\r\n")), OK | FOURXX | {304}))
    add(Case("If-Unmodified-Since junk", request(b"/objects/ds/big.bin", headers=(
        b"If-Unmodified-Since: -1\r\n")), OK | FOURXX))

    # paths: '..' in every encoding, bad UTF-8 and percent-encoding, NUL, injection
    for path in DOTDOT + BAD_BYTES:
        cases.extend(_objects(path, FOURXX))
        listing = b"/list/" + path
        add(Case(f"GET /list/{path[:60]!r}", request(listing), FOURXX | {200}))
        if target.kind == "hub":
            add(Case(f"GET /manifest/{path[:60]!r}", request(b"/manifest/" + path), FOURXX))
        else:
            add(Case(f"DELETE /cache/{path[:60]!r}",
                     request(b"/cache/" + path, method=b"DELETE"), FOURXX | {200}))

    for path in (b"ds/small%2ebin", b"ds/%73mall.bin", b"ds/%73%6d%61%6c%6c%2e%62%69%6e"):
        add(Case(f"percent-encoded valid name {path!r}", request(b"/objects/" + path),
                 frozenset({200}), body=small))

    # symlinks planted in the root
    for link in ESCAPING_LINKS:
        cases.extend(_objects(link.encode(), name=f"escaping symlink {link}"))
        if target.kind == "hub":
            add(Case(f"manifest of {link}", request(b"/manifest/" + link.encode()),
                     frozenset({400, 404})))
    cases.extend(_objects(b"ds/dangling.bin", frozenset({404}), "dangling symlink"))
    cases.extend(_objects(b"ds/fifo.bin", frozenset({400, 404}), "a FIFO in the root"))
    add(Case("symlink inside the root", request(b"/objects/ds/alias.bin"),
             frozenset({200, 400, 404}), body=small))
    for prefix in (b"", b"ds/", b"escape-dir/", b"ds/link-out.bin", b"ds/link-out.bin/"):
        for accept in (b"", b"Accept: application/msgpack\r\n"):
            add(Case(f"listing {prefix!r} {accept!r} with symlinks", request(
                b"/list/" + prefix, headers=accept), frozenset({200, 400, 404}),
                forbidden=() if b"link-out" in prefix else (
                    b"secret.txt", b"link-out", b"abs-out", b"etc-passwd", b"fifo"),
                empty_listing=b"link-out" in prefix))

    # bad methods, HTTP/1.0, pipelining
    for method in (b"PUT", b"PATCH", b"OPTIONS", b"TRACE", b"POST", b"DELETE", b"CONNECT"):
        add(Case(f"{method.decode()} /objects", request(b"/objects/ds/small.bin", method=method),
                 FOURXX))
    for method in (b"PROPFIND", b"FOO", b"M-SEARCH", b"BREW", b"get"):
        add(Case(f"{method.decode()} /objects", request(b"/objects/ds/small.bin", method=method),
                 frozenset({501}), count=1))
    add(Case("HTTP/1.0", request(b"/objects/ds/small.bin", version=b"HTTP/1.0", close=False),
             frozenset({200}), body=small))
    add(Case("HTTP/1.0 ranged", request(b"/objects/ds/big.bin", version=b"HTTP/1.0",
             headers=b"Range: bytes=10-19\r\n", close=False), frozenset({206}), body=big[10:20]))
    add(Case("HTTP/1.0 HEAD", request(b"/objects/ds/big.bin", method=b"HEAD",
             version=b"HTTP/1.0", close=False), frozenset({200})))
    add(Case("HTTP/1.0 keep-alive", request(b"/objects/ds/small.bin", version=b"HTTP/1.0",
             headers=b"Connection: keep-alive\r\n", close=False), frozenset({200}), body=small))
    one = request(b"/objects/ds/small.bin", close=False)
    # In one read, aiohttp drops the valid requests before a parse error: one 400.
    add(Case("pipelined valid then garbage", one + b"\x00\xffGARBAGE\r\n\r\n",
             frozenset({200, 400}), body=small))
    add(Case("valid, then garbage on the same connection", one, frozenset({200, 400}),
             count=2, body=small, pieces=((0.1, b"\x00\xffGARBAGE\r\n\r\n"),)))
    add(Case("pipelined garbage then valid", b"BLAH\x01 / X\r\n\r\n" + one, FOURXX, count=1))
    add(Case("40 pipelined requests", one * 39 + request(b"/objects/ds/small.bin"),
             frozenset({200}), count=40, body=small))
    add(Case("pipelined valid then half a request", one + b"GET /objects/ds/sm",
             frozenset({200}), count=1, body=small, wait=0.5))
    add(Case("pipelined HEAD, GET, bad", request(b"/objects/ds/small.bin", method=b"HEAD",
             close=False) + one + b"GET /%00 HTTP/1.1\r\n\r\n", frozenset({200, 400})))

    # header injection
    for name, headers in [
        ("CRLF in X-Request-Id", b"X-Request-Id: a\r\nSet-Cookie: x=1\r\n"),
        ("encoded CRLF in X-Request-Id", b"X-Request-Id: a%0d%0aSet-Cookie:%20x=1\r\n"),
        ("non-ASCII X-Request-Id", b"X-Request-Id: \xc3\xa9\xff\xfe\r\n"),
        ("huge X-Request-Id", b"X-Request-Id: " + b"r" * 30000 + b"\r\n"),
        ("control chars in X-Request-Id", b"X-Request-Id: a\x01\x0b\x1fb\r\n"),
        ("CRLF in Range", b"Range: bytes=0-1\r\nX-Injected: 1\r\n"),
        ("junk Host", b"Host: \xff\xfe\x01\r\n"),
        ("junk Authorization", b"Authorization: Bearer \xff..\x01\r\n"),
        ("junk Accept", b"Accept: application/msgpack;q=\xff, */*;q=-1\r\n"),
        ("junk plan header", b"X-Hubspoke-Plan: ../\xff%00\r\n"),
        ("unknown Expect", b"Expect: 100-continue, foo\r\n"),
        ("Transfer-Encoding on GET", b"Transfer-Encoding: chunked\r\n"),
        ("Content-Length on GET", b"Content-Length: 5\r\n"),
    ]:
        add(Case(f"injection: {name}", request(b"/objects/ds/small.bin", headers=headers),
                 OK | FOURXX, answered=None, wait=0.5))

    if target.kind == "spoke":
        cases.extend(admin_cases())
    else:
        add(Case("POST /warm on the hub", post(b"/warm", b'{"prefix": "ds/"}'), FOURXX))
        add(Case("POST /plans on the hub", post(b"/plans", b"\x00garbage"), FOURXX))
    return cases


@functools.cache
def gzip_bomb(size: int = MAX_BODY_BYTES + (8 << 20)) -> bytes:
    """~200 KB of gzip that inflate past the spoke's body limit."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    block = b"\0" * (1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(size >> 20)), packer.flush()])




def admin_cases() -> list[Case]:
    """Truncated, oversized and garbage bodies on the spoke's POST endpoints."""
    cases: list[Case] = []
    add = cases.append
    warm = b'{"paths": ["ds/small.bin"]}'
    plan = b'{"reads": [["ds/small.bin", 0, 100]]}'
    for path in (b"/warm", b"/plans"):
        p = path.decode()
        add(Case(f"{p}: body shorter than Content-Length", request(path, method=b"POST", headers=(
            b"Content-Type: application/json\r\nContent-Length: 100\r\n"), body=b'{"pa'),
            answered=False, wait=0.3))
        add(Case(f"{p}: body cut and closed", request(path, method=b"POST", headers=(
            b"Content-Length: 100000\r\n"), body=b"[" * 1000), answered=False, wait=0.3))
        add(Case(f"{p}: body longer than Content-Length", request(path, method=b"POST", headers=(
            b"Content-Type: application/json\r\nContent-Length: 5\r\n"), body=warm + plan),
            answered=None))
        for value in (b"-1", b"abc", b"1 2", b"99999999999999999999999999", b"0x10", b"+5",
                      b"5, 6", b""):
            add(Case(f"{p}: Content-Length {value!r}", request(path, method=b"POST", headers=(
                b"Content-Length: " + value + b"\r\n"), body=b"{}"), answered=None, wait=0.5))
        add(Case(f"{p}: two Content-Lengths", request(path, method=b"POST", headers=(
            b"Content-Length: 2\r\nContent-Length: 3\r\n"), body=b"{}x"), answered=None))
        add(Case(f"{p}: Content-Length and chunked", request(path, method=b"POST", headers=(
            b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n"), body=b"2\r\n{}\r\n0\r\n\r\n"),
            answered=None))
        for chunked in (b"zz\r\n{}\r\n0\r\n\r\n", b"ffffffffffffffffffffff\r\n{}\r\n0\r\n\r\n",
                        b"-2\r\n{}\r\n0\r\n\r\n", b"2\r\n{}0\r\n\r\n",
                        b"2;\xff\r\n{}\r\n0\r\n\r\n"):
            add(Case(f"{p}: chunked {chunked[:20]!r}", request(path, method=b"POST", headers=(
                b"Transfer-Encoding: chunked\r\n"), body=chunked), answered=None, wait=0.5))
        add(Case(f"{p}: Transfer-Encoding junk", request(path, method=b"POST", headers=(
            b"Transfer-Encoding: gzip, \xff\r\n"), body=b"{}"), answered=None, wait=0.5))
        for coding in (b"zstd", b"compress", b"gzip, gzip, gzip", b"\xff"):
            add(Case(f"{p}: Content-Encoding {coding!r}", post(path, b"{}", extra=(
                b"Content-Encoding: " + coding + b"\r\n")), FOURXX | {201, 202}))
        if path == b"/plans":
            add(Case(f"{p}: gzip bomb past the body limit", post(path, gzip_bomb(), extra=(
                b"Content-Encoding: gzip\r\n")), frozenset({413}), wait=10))
        add(Case(f"{p}: 100-continue then garbage", post(path, b"\x00\x01\x02",
                 extra=b"Expect: 100-continue\r\n"), FOURXX))
        add(Case(f"{p}: empty body", post(path, b""), FOURXX))
        add(Case(f"{p}: Content-Length 10 GiB", request(path, method=b"POST", headers=(
            b"Content-Length: 10737418240\r\n"), body=b"{"), FOURXX, answered=None, wait=0.3))
        rng = random.Random(SEED)
        for ct in (b"application/json", b"application/msgpack"):
            for i in range(8):
                add(Case(f"{p}: random {ct.decode()} body {i}",
                         post(path, rng.randbytes(rng.randrange(1, 300)), ct), FOURXX))
        for name, body in [
            ("truncated msgpack", msgpack.packb({"reads": [["ds/small.bin", 0, 100]]})[:-3]),
            ("msgpack array of 2**32-1", b"\xdd\xff\xff\xff\xff\x01"),
            ("msgpack map of 2**32-1", b"\xdf\xff\xff\xff\xff\x01"),
            ("msgpack str of 2**32-1", b"\xdb\xff\xff\xff\xff" + b"a" * 10),
            ("msgpack bin of 2**32-1", b"\xc6\xff\xff\xff\xff" + b"a" * 10),
            ("msgpack ext", b"\xd4\x05\x01"),
            ("msgpack nested 100000 deep", b"\x91" * 100000),
            ("msgpack map with bin keys", msgpack.packb({b"reads": [[b"ds/small.bin", 0, 1]]})),
            ("msgpack map with list key", b"\x81\x91\x01\x01"),
            ("msgpack map with map key", b"\x81\x81\x01\x01\x01"),
            ("msgpack array", msgpack.packb([1, 2, 3])),
            ("msgpack nil", msgpack.packb(None)),
            ("msgpack invalid UTF-8 str", b"\x81\xa5reads\xa2\xff\xfe"),
            ("msgpack negative offset", msgpack.packb({"reads": [["ds/small.bin", -1, 5]],
                                                       "paths": ["ds/../x"]})),
            ("msgpack float", msgpack.packb({"reads": [["ds/small.bin", 0.5, 1e300]],
                                             "paths": [1.5]})),
            ("msgpack bin path", msgpack.packb({"reads": [[b"ds/small.bin", 0, 1]],
                                                "paths": [b"ds/small.bin"]})),
            ("msgpack NUL path", msgpack.packb({"reads": [["ds/\x00", 0, 1]],
                                                "paths": ["ds/\x00"]})),
            ("msgpack dotdot prefix", msgpack.packb({"prefix": "../", "reads": [["..", 0, 1]]})),
        ]:
            add(Case(f"{p}: {name}", post(path, body, b"application/msgpack"), FOURXX))
        for name, body in [
            ("invalid UTF-8", b'{"prefix": "\xff\xfe"}'),
            ("lone surrogate", b'{"prefix": "\\ud800", "reads": [["\\udc00", 0, 1]]}'),
            ("NaN", b'{"reads": [["ds/small.bin", NaN, Infinity]], "paths": [NaN]}'),
            ("1e400", b'{"reads": [["ds/small.bin", 1e400, 1]], "prefix": 1e400}'),
            ("5000-digit number", b'{"reads": [["ds/small.bin", ' + b"9" * 5000 + b', 1]]}'),
            ("negative numbers", b'{"reads": [["ds/small.bin", -1, -1]]}'),
            ("booleans", b'{"reads": [["ds/small.bin", true, false]], "paths": [true]}'),
            ("dotdot", b'{"reads": [["../secret.txt", 0, 1]], "paths": ["../secret.txt"]}'),
            ("encoded dotdot", b'{"reads": [["%2e%2e/x", 0, 1]], "paths": ["ds/%252e%252e/x"]}'),
            ("absolute", b'{"reads": [["/etc/passwd", 0, 1]], "paths": ["/etc/passwd"]}'),
            ("NUL", b'{"reads": [["ds/\\u0000", 0, 1]], "paths": ["ds/\\u0000"]}'),
            ("prefix not a string", b'{"prefix": ["ds/"]}'),
            ("paths not a list", b'{"paths": "ds/small.bin"}'),
            ("both paths and prefix", b'{"paths": [], "prefix": ""}'),
            ("read not a triple", b'{"reads": [["ds/small.bin", 0]], "prefix": {}}'),
            ("reads empty", b'{"reads": []}'),
            ("reads not a list", b'{"reads": {"a": 1}}'),
            ("a 1 MB path", b'{"reads": [["' + b"a" * (1 << 20) + b'", 0, 1]], "paths": ["'
                            + b"a" * (1 << 20) + b'"]}'),
            ("array", b"[1, 2, 3]"),
            ("string", b'"reads"'),
            ("trailing garbage", warm[:-1] + b"}}}garbage"),
            ("duplicate keys", b'{"paths": ["ds/small.bin"], "paths": 5}'),
            ("nested 900 deep", b"[" * 900 + b"]" * 900),
        ]:
            add(Case(f"{p}: JSON {name}", post(path, body), FOURXX))
        # Well-formed: the plan skips reads past the end, the warm job fails later at the hub.
        for name, body in [
            ("4000-digit offset", b'{"reads": [["ds/small.bin", ' + b"9" * 4000 + b', 1]]}'),
            ("escaping symlink", b'{"reads": [["ds/link-out.bin", 0, 10]]}' if path == b"/plans"
             else b'{"paths": ["ds/link-out.bin"]}'),
        ]:
            add(Case(f"{p}: JSON {name}", post(path, body), FOURXX | {201, 202}))
        add(Case(f"{p}: msgpack uint64", post(path, msgpack.packb(
            {"reads": [["ds/small.bin", 2**64 - 1, 2**64 - 1]], "prefix": 2**64 - 1}),
            b"application/msgpack"), FOURXX | {201, 202}))
        add(Case(f"{p}: valid but a missing object", post(path, (
            b'{"paths": ["ds/missing.bin"]}' if path == b"/warm"
            else b'{"reads": [["ds/missing.bin", 0, 1]]}')), FOURXX | {201, 202}))
    for method, target_ in [(b"GET", b"/warm/%00"), (b"GET", b"/warm/..%2f..%2fetc"),
                            (b"DELETE", b"/warm/\xff"), (b"GET", b"/plans/" + b"9" * 5000),
                            (b"DELETE", b"/plans/%2e%2e"), (b"GET", b"/plans/\x00"),
                            (b"PUT", b"/warm"), (b"PATCH", b"/plans"), (b"DELETE", b"/cache/"),
                            (b"DELETE", b"/cache/%2e%2e/"), (b"DELETE", b"/cache/ds/../../")]:
        add(Case(f"{method.decode()} {target_[:40]!r}", request(target_, method=method),
                 FOURXX | {200}))
    return cases


async def _run_cases(target: Target, cases: list[Case]) -> list[str]:
    gate = asyncio.Semaphore(16)

    async def run(case: Case) -> list[str]:
        async with gate:
            try:
                ex = await exchange(target.port, case.payload, wait=case.wait,
                                    pieces=list(case.pieces))
            except AssertionError as exc:  # a malformed answer, or no close after EOF
                return [f"{case.name}: {exc}"]
        problems = check_invariants(ex)
        finals = [r for r in ex.replies if r.status >= 200]
        problems += [f"answered {r.status}" for r in finals if r.status not in case.allowed]
        if case.answered and not finals:
            problems.append(f"no answer (closed={ex.closed}, timed out={ex.timed_out})")
        if case.answered is False and finals:
            problems.append(f"answered {ex.statuses} to an incomplete request")
        if case.count is not None and len(finals) != case.count:
            problems.append(f"{len(finals)} answers, not {case.count}: {ex.statuses}")
        for r in finals:
            problems += [f"answer holds {bad!r}" for bad in case.forbidden if bad in r.body]
            if case.empty_listing and r.status == 200:
                listing = (msgpack.unpackb(r.body) if r.body[:1] != b"{"
                           else json.loads(r.body))
                if listing["objects"]:
                    problems.append(f"lists {listing['objects']}")
        if case.body is not None:
            problems += [f"{r.status} with the wrong {len(r.body)} bytes" for r in finals
                         if 200 <= r.status < 300 and not ex.payload.startswith(b"HEAD")
                         and r.body != case.body]
        return [f"{case.name}: {p}" for p in problems]

    results = await asyncio.gather(*(run(c) for c in cases))
    return [p for problems in results for p in problems]


async def test_crafted_hostile_requests(
    target: Target, server_errors: Callable[[], list[str]],
    record_property: Callable[[str, object], None],
) -> None:
    cases = crafted_cases(target)
    record_property("requests_sent", len(cases))
    problems = await _run_cases(target, cases)
    assert not problems, "\n".join(problems)
    await no_request_left_in_a_handler(target)
    await healthy_and_correct(target)
    assert not server_errors(), "\n".join(server_errors())
    print(f"\n{target.kind}: {len(cases)} crafted hostile requests")


# ---------------------------------------------------------------------------
# seeded byte-wise mutations of valid requests


def templates(target: Target) -> list[bytes]:
    """Valid requests the mutator starts from."""
    base = [
        request(b"/objects/ds/small.bin", headers=b"Range: bytes=10-99\r\n"),
        request(b"/objects/ds/big.bin", headers=b"Range: bytes=0-9,65530-65545,-7\r\n"),
        request(b"/objects/ds/partial.bin", method=b"HEAD"),
        request(b"/objects/ds/exact.bin", headers=(
            b'If-None-Match: "x"\r\nIf-Range: "y"\r\nRange: bytes=100-\r\n')),
        request(b"/objects/other/notes.csv", headers=b"X-Request-Id: fuzz-1\r\n"),
        request(b"/list/ds/", headers=b"Accept: application/msgpack\r\n"),
        request(b"/list/"),
        request(b"/healthz"),
        request(b"/objects/ds/one-byte.bin", version=b"HTTP/1.0", close=False),
    ]
    if target.kind == "hub":
        return [*base, request(b"/manifest/ds/big.bin"), request(b"/manifest/ds/empty.bin")]
    return [
        *base,
        request(b"/stats"),
        request(b"/objects/ds/small.bin", headers=b"X-Hubspoke-Plan: 0123456789abcdef\r\n"),
        post(b"/plans", b'{"reads": [["ds/small.bin", 0, 100], ["ds/big.bin", 65536, 10]]}'),
        post(b"/plans", msgpack.packb({"reads": [["ds/partial.bin", 0, 10]]}),
             b"application/msgpack"),
        post(b"/warm", b'{"paths": ["ds/small.bin", "ds/one-byte.bin"]}'),
        request(b"/warm"),
        request(b"/plans"),
        request(b"/cache/ds/one-byte.bin", method=b"DELETE"),
    ]


INTERESTING = [
    b"\x00", b"\xff", b"%", b"%00", b"%2e", b"%2e%2e/", b"../", b"/", b"\\", b"\r", b"\n",
    b"\r\n", b" ", b":", b",", b"-", b"=", b";", b"\x80", b"\xc0\xae", b"%c0%ae", b"9" * 25,
    b"-1", b"0", b"\t", b"?", b"#", b"*", b"%25", b"%ff", b"\r\n\r\n", b"Range: bytes=",
    b"Transfer-Encoding: chunked\r\n", b"Content-Length: 7\r\n", b"HTTP/1.0", b"\x7f",
]


def mutate(rng: random.Random, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        op = rng.randrange(8)
        if op == 0 and at < len(data):
            data[at] ^= 1 << rng.randrange(8)
        elif op == 1 and at < len(data):
            data[at] = rng.randrange(256)
        elif op == 2:
            data[at:at] = rng.choice(INTERESTING)
        elif op == 3:
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:
            del data[at:at + rng.randint(1, 8)]
        elif op == 5:
            span = bytes(data[at:at + rng.randint(1, 64)])
            where = rng.randrange(len(data) + 1)
            data[where:where] = span * rng.randint(1, 3)
        elif op == 6 and at < len(data):
            data[at:at + 1] = rng.choice(INTERESTING)[:1]
        elif op == 7:
            digits = rng.choice([b"0", b"1", b"18446744073709551616", b"9" * 40, b"-5"])
            data[at:at] = digits
    return bytes(data)


async def exchange_all(
    port: int, payloads: list[bytes], concurrency: int
) -> list[tuple[bytes, Exchange | AssertionError]]:
    """Each payload's exchange (``concurrency`` at a time), or why its answer was malformed."""
    gate = asyncio.Semaphore(concurrency)

    async def one(payload: bytes) -> tuple[bytes, Exchange | AssertionError]:
        async with gate:
            try:
                return payload, await exchange(port, payload, wait=0.5)
            except AssertionError as exc:
                return payload, exc

    return await asyncio.gather(*(one(p) for p in payloads))


async def test_mutated_requests(
    target: Target, server_errors: Callable[[], list[str]],
    record_property: Callable[[str, object], None],
) -> None:
    rng = random.Random(f"{SEED}-{target.kind}")
    bases = templates(target)
    for base in bases:  # the starting points really are valid
        ex = await exchange(target.port, base)
        assert ex.statuses and all(200 <= s < 300 for s in ex.statuses), (base, ex.statuses)
    payloads = [mutate(rng, rng.choice(bases)) for _ in range(MUTATED_PER_SERVER)]
    record_property("requests_sent", len(bases) + len(payloads))
    outcomes: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    started = time.monotonic()
    for payload, ex in await exchange_all(target.port, payloads, concurrency=32):
        if isinstance(ex, AssertionError):  # a malformed answer, or no close after EOF
            problems.append(f"{ex} <- {payload[:300]!r}")
            continue
        outcomes.update(str(s) for s in ex.statuses)
        if ex.timed_out:
            outcomes["waited for more bytes"] += 1
        elif not ex.statuses:
            outcomes["closed without answer"] += 1
        problems.extend(f"{p} <- {payload[:300]!r}" for p in check_invariants(ex))
    elapsed = time.monotonic() - started
    assert not problems, "\n".join(problems[:30])
    await no_request_left_in_a_handler(target)
    await healthy_and_correct(target)
    assert not server_errors(), "\n".join(server_errors()[:30])
    print(f"\n{target.kind}: {len(payloads)} mutated requests in {elapsed:.1f} s: "
          f"{dict(sorted(outcomes.items()))}")


# ---------------------------------------------------------------------------
# symlinks under tenant prefixes, with tokens on (tests/support/tenant_links.py)

TENANT_MUTATED_PER_SERVER = 300


@dataclass
class TenantTarget:
    kind: str  # "hub" | "spoke" | "spoke --workers 2"
    url: str
    port: int
    cache_dir: Path | None  # a spoke's, to look for A's bytes in afterwards


@pytest.fixture(params=["hub", "spoke", "spoke --workers 2"])
async def tenant_target(
    request: pytest.FixtureRequest, tmp_path: Path, secret_file: Path, mint: Mint
) -> AsyncIterator[TenantTarget]:
    root = tmp_path / "tenants"
    plant_tenant_links(root)
    hub = await start_hub(HubConfig(root=str(root), chunk_size=CHUNK,
                                    auth_secret_file=str(secret_file)))
    hub_token = tmp_path / "hub-token"
    hub_token.write_text(mint("spoke-1", [""]) + "\n")
    cache_dir = tmp_path / "cache"
    spoke: RunningServer | None = None
    process: Process | None = None
    if request.param == "hub":
        url, cache = hub.url, None
    elif request.param == "spoke":
        spoke = await start_spoke(SpokeConfig(
            hub_url=hub.url, cache_dir=str(cache_dir), capacity_bytes=64 << 20,
            auth_secret_file=str(secret_file), hub_token_file=str(hub_token)))
        url, cache = spoke.url, cache_dir
    else:
        process = await asyncio.to_thread(start_process, "spoke", [
            "--hub", hub.url, "--cache-dir", str(cache_dir), "--capacity", "64MiB",
            "--workers", "2", "--auth-secret-file", str(secret_file),
            "--hub-token-file", str(hub_token), "--access-log", "off",
            "--log-level", "warning"])
        url, cache = process.url, cache_dir
    try:
        yield TenantTarget(request.param, url, int(url.rsplit(":", 1)[1]), cache)
    finally:
        if process is not None:
            await asyncio.to_thread(process.stop)
        if spoke is not None:
            await spoke.stop()
        await hub.stop()


def _bearer(token: str) -> bytes:
    return f"Authorization: Bearer {token}\r\n".encode()


def _spellings(path: str) -> list[bytes]:
    """``path`` as written, with its last segment percent-encoded, and with every
    segment's first character percent-encoded."""
    *dirs, last = path.split("/")
    whole = "".join(f"%{b:02x}" for b in last.encode())
    first = "/".join(f"%{ord(s[0]):02x}{s[1:]}" for s in path.split("/"))
    return [path.encode(), "/".join([*dirs, whole]).encode(), first.encode()]


READ_HEADERS = [b"", b"Range: bytes=0-99\r\n", b"Range: bytes=0-9,70000-70099,-50\r\n",
                b'If-Range: "x"\r\nRange: bytes=100-\r\n', b"If-None-Match: *\r\n"]


def tenant_requests(kind: str, mint: Mint) -> list[bytes]:
    """Every request a ``b/`` or ``c/`` token (or the spoke's own root-scoped kind of
    token) could make that names B's links to A: reads in every spelling, manifests,
    listings, plans, warm jobs and purges."""
    b, c, root = _bearer(mint("b", ["b/"])), _bearer(mint("c", ["c/"])), _bearer(mint("ops", [""]))
    b_admin, c_admin = _bearer(mint("b", ["b/"], admin=True)), _bearer(mint("c", ["c/"],
                                                                          admin=True))
    spoke = kind != "hub"
    out: list[bytes] = []
    for path in [*TO_A, "b/alias.bin"]:
        token, admin = (c, c_admin) if path.startswith("c/") else (b, b_admin)
        for spelled in _spellings(path):
            for extra in READ_HEADERS:
                out.append(request(b"/objects/" + spelled, headers=token + extra))
            out.append(request(b"/objects/" + spelled, method=b"HEAD", headers=token))
            out.append(request(b"/objects/" + spelled, headers=root))
            if not spoke:
                out.append(request(b"/manifest/" + spelled, headers=token))
        if spoke:
            read = json.dumps({"reads": [[path, 0, 100], [path, 70000, 100]]}).encode()
            out.append(post(b"/plans", read, extra=token))
            out.append(post(b"/warm", json.dumps({"paths": [path]}).encode(), extra=admin))
            out.append(request(b"/cache/" + path.encode(), method=b"DELETE", headers=admin))
    for prefix in (b"b", b"b/", b"b/dir-to-a", b"b/dir-to-a/", b"b/dir-chain/", b"c", b"c/"):
        token, admin = (c, c_admin) if prefix.startswith(b"c") else (b, b_admin)
        for accept in (b"", b"Accept: application/msgpack\r\n"):
            out.append(request(b"/list/" + prefix, headers=token + accept))
        if spoke:
            out.append(post(b"/warm", b'{"prefix": "' + prefix + b'"}', extra=admin))
    return out


async def test_no_tenant_reads_a_sibling_tenants_bytes_through_symlinks(
    tenant_target: TenantTarget, mint: Mint, server_errors: Callable[[], list[str]],
    record_property: Callable[[str, object], None],
) -> None:
    crafted = tenant_requests(tenant_target.kind, mint)
    rng = random.Random(f"{SEED}-tenants-{tenant_target.kind}")
    # Not HEADs: one mutated out of Connection: close leaves the reader unable to tell
    # the end of the answer, and waiting that out costs seconds each.
    bases = [r for r in crafted if not r.startswith(b"HEAD ")]
    mutated = [mutate(rng, rng.choice(bases)) for _ in range(TENANT_MUTATED_PER_SERVER)]
    record_property("requests_sent", len(crafted) + len(mutated))
    problems: list[str] = []
    for payload, ex in await exchange_all(tenant_target.port, crafted + mutated, 16):
        if isinstance(ex, AssertionError):  # a malformed answer, or no close after EOF
            problems.append(f"{ex} <- {payload[:200]!r}")
            continue
        found = check_invariants(ex)
        found += ["tenant A's bytes" for r in ex.replies if leaks(r.head + r.body)]
        problems.extend(f"{p} <- {payload[:200]!r}" for p in found)
    assert not problems, "\n".join(problems[:30])
    if tenant_target.cache_dir is not None:
        await _tenant_work_settled(tenant_target.url, mint)
        assert files_holding_a(tenant_target.cache_dir) == []
    async with aiohttp.ClientSession() as http:
        status, _, body = await call(http, f"{tenant_target.url}/objects/b/own.bin",
                                     mint("b", ["b/"]))
        assert status == 200 and body == OWN  # B still reads its own object
    assert not server_errors(), "\n".join(server_errors()[:30])


async def _tenant_work_settled(url: str, mint: Mint) -> None:
    """Wait until no warm job of B or C runs and no chunk is being fetched or stored."""
    async with aiohttp.ClientSession() as http:
        for tenant, prefix in (("b", "b/"), ("c", "c/")):
            admin = mint(tenant, [prefix], admin=True)
            for _ in range(400):
                jobs = json.loads((await call(http, f"{url}/warm", admin))[2])["jobs"]
                if all(job["state"] != "running" for job in jobs):
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError(f"{tenant}'s warm jobs still running: {jobs}")
        root = mint("ops", [""], admin=True)
        await settled_stats(http, url, headers={"Authorization": f"Bearer {root}"})


# seeded changes to the spoke's chunk files while it serves them

CHUNK_FILE_ROUNDS = 60


def _chunk_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in (cache_dir / "chunks").glob("*/*") if "-" in p.name)


def change_chunk_file(rng: random.Random, files: list[Path], secret: Path) -> str:
    """Do one hostile thing to one of ``files`` (chunk files on the spoke's disk)."""
    path, other = rng.sample(files, 2)
    if not path.is_file() or path.is_symlink():
        return "skipped"  # changed before (a FIFO, a directory): left as it is
    kind = rng.choice(["flip", "copy", "swap", "symlink", "passwd", "shrink", "fifo",
                       "directory", "chmod"])
    if kind == "flip":
        with path.open("r+b") as f:
            at = rng.randrange(max(1, path.stat().st_size))
            f.seek(at)
            old = f.read(1) or b"\0"
            f.seek(at)
            f.write(bytes([old[0] ^ (1 << rng.randrange(8))]))
    elif kind == "copy" and other.is_file():
        path.write_bytes(other.read_bytes())
    elif kind == "swap" and other.is_file() and not other.is_symlink():
        aside = path.with_name(path.name + ".aside")
        path.rename(aside)
        other.rename(path)
        aside.rename(other)
    elif kind in ("symlink", "passwd"):
        path.unlink()
        path.symlink_to(secret if kind == "symlink" else Path("/etc/passwd"))
    elif kind == "shrink":
        os.truncate(path, rng.randrange(path.stat().st_size))
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "chmod":
        path.chmod(0o000)
    return kind


def chunk_file_read(rng: random.Random, size: int) -> tuple[bytes, list[tuple[int, int]]]:
    """A plain read of ds/big.bin: one range, or a batch of a few; and its ranges."""
    ranges = []
    for _ in range(rng.choice([1, 1, 3, 8])):
        start = rng.randrange(size)
        ranges.append((start, min(size, start + rng.choice([1, 100, 5000, 70000]))))
    spec = ",".join(f"{a}-{b - 1}" for a, b in ranges)
    return request(b"/objects/ds/big.bin", headers=f"Range: bytes={spec}\r\n".encode()), ranges


async def test_changed_chunk_files_are_never_served(
    dataset: Dataset, make_spoke: SpokeFactory, tmp_path: Path,
    server_errors: Callable[[], list[str]],
) -> None:
    """Every answer is the object's bytes, whatever is done to the files (its own test
    file pins each change: tests/integration/test_chunk_files.py)."""
    spoke = await make_spoke(scrub_rate_bytes_s=0)
    port = int(spoke.url.rsplit(":", 1)[1])
    big = dataset[1]["ds/big.bin"]
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET * (1 + 70000 // len(SECRET)))  # as long as a chunk
    assert (await exchange(port, request(b"/objects/ds/big.bin"))).replies[0].body == big
    rng = random.Random(f"{SEED}-chunk-files")
    done: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    for _ in range(CHUNK_FILE_ROUNDS):
        files = _chunk_files(tmp_path / "cache")
        if len(files) >= 2:
            done[change_chunk_file(rng, files, secret)] += 1
        payload, ranges = chunk_file_read(rng, len(big))
        ex = await exchange(port, payload)
        problems += check_invariants_of_read(ex, big, ranges)
    assert not problems, "\n".join(problems[:30])
    await no_request_left_in_a_handler_of(spoke)
    assert not server_errors(), "\n".join(server_errors()[:30])
    print(f"\nchunk files: {dict(sorted(done.items()))}")


def check_invariants_of_read(
    ex: Exchange, data: bytes, ranges: list[tuple[int, int]]
) -> list[str]:
    """What is wrong with the answer to a plain read of ``ranges`` of ``data``."""
    if len(ex.replies) != 1:
        return [f"{len(ex.replies)} answers, closed={ex.closed}"]
    reply = ex.replies[0]
    if reply.status != 206 or reply.truncated:
        return [f"{reply.status} answer (truncated: {reply.truncated})"]
    if SECRET in reply.body or b"root:x:0:0" in reply.body:
        return ["bytes from outside the cache"]
    wanted = [data[a:b] for a, b in ranges]
    if len(ranges) == 1:
        return [] if reply.body == wanted[0] else ["wrong bytes"]
    # Every range's bytes are in the multipart body (the planner may merge some).
    return [] if all(part in reply.body for part in wanted) else ["wrong bytes in a batch"]


# ---------------------------------------------------------------------------
# found by this fuzzing; fixed in other files (strict: an xpass means the fix landed)


async def test_symlink_loop_in_the_root_is_a_404_not_a_500(target: Target) -> None:
    (target.root / "ds" / "loop.bin").symlink_to("loop.bin")
    (target.root / "ds" / "loop-a.bin").symlink_to("loop-b.bin")
    (target.root / "ds" / "loop-b.bin").symlink_to("loop-a.bin")
    targets = [b"/objects/ds/loop.bin", b"/objects/ds/loop-a.bin", b"/list/ds/", b"/list/"]
    if target.kind == "hub":
        targets.append(b"/manifest/ds/loop.bin")
    statuses = {}
    for path in targets:
        ex = await exchange(target.port, request(path))
        statuses[path] = ex.statuses
    assert all(s and s[0] < 500 for s in statuses.values()), statuses
    # The listing still lists the good objects.
    ex = await exchange(target.port, request(b"/list/ds/"))
    names = [e["path"] for e in json.loads(ex.replies[0].body)["objects"]]
    assert "ds/small.bin" in names and "ds/loop.bin" not in names


async def test_listing_does_not_walk_outside_the_root(target: Target) -> None:
    outside = target.root.parent / "outside-tree"
    (outside / "deep").mkdir(parents=True)
    for i in range(20):
        (outside / "deep" / f"f{i}.bin").write_bytes(b"x")
    (target.root / "ds" / "out-dir").symlink_to(outside, target_is_directory=True)
    (target.root / "up").symlink_to(target.root.parent, target_is_directory=True)
    for prefix in (b"ds/out-dir/", b"up/"):
        ex = await exchange(target.port, request(b"/list/" + prefix))
        assert ex.statuses and ex.statuses[0] in (200, 400, 404), ex.statuses
        if ex.statuses[0] == 200:
            assert json.loads(ex.replies[0].body)["objects"] == [], ex.replies[0].body[:300]


@pytest.mark.parametrize("path", [b"/plans", b"/warm"])
async def test_deeply_nested_json_body_is_a_400(
    path: bytes, dataset: Dataset, make_spoke: SpokeFactory
) -> None:
    spoke = await make_spoke()
    port = int(spoke.url.rsplit(":", 1)[1])
    for body in (b"[" * 100_000, b'{"a":' * 100_000):
        ex = await exchange(port, post(path, body))
        assert ex.statuses == [400], ex.statuses


async def test_expect_header_with_invalid_utf8_is_a_4xx_not_a_500(target: Target) -> None:
    routes = [(b"GET", b"/objects/ds/small.bin"), (b"GET", b"/healthz")]
    if target.kind == "spoke":
        routes.append((b"POST", b"/warm"))
    for method, path in routes:
        ex = await exchange(target.port, request(
            path, method=method, headers=b"Expect: 100-continue, \xff\r\n"))
        assert ex.statuses and all(400 <= s < 500 for s in ex.statuses), (path, ex.statuses)


async def test_expect_header_with_invalid_utf8_on_an_unrouted_path(target: Target) -> None:
    ex = await exchange(target.port, request(
        b"/no-such-route", method=b"POST", headers=b"Expect: 100-continue, \xff\r\n"))
    assert ex.statuses and all(400 <= s < 500 for s in ex.statuses), ex.statuses


@pytest.mark.parametrize("coding", [b"gzip", b"deflate", b"br"])
async def test_undecodable_content_encoding_is_a_400(
    coding: bytes, dataset: Dataset, make_spoke: SpokeFactory
) -> None:
    spoke = await make_spoke()
    port = int(spoke.url.rsplit(":", 1)[1])
    for path in (b"/plans", b"/warm"):
        ex = await exchange(port, post(path, b"not compressed at all",
                                       extra=b"Content-Encoding: " + coding + b"\r\n"))
        assert ex.statuses == [400], (path, ex.statuses)


# ---------------------------------------------------------------------------
# tokens never reach a log or an answer, whatever else is wrong with the request

TOKEN_REQUESTS_PER_SERVER = 400


def hostile_token_requests(rng: random.Random, token: str, targets: list[bytes]) -> bytes:
    """A request carrying ``token`` in some hostile shape (control bytes in its line,
    folded, repeated, overlong, in a name...)."""
    tok = token.encode()
    cut = rng.randrange(len(tok) + 1)
    stray = bytes([rng.choice([*range(0, 9), *range(10, 32), 127])])
    shapes = [
        b"Authorization: Bearer " + tok[:cut] + stray + tok[cut:] + b"\r\n",
        b"Authorization: Bearer " + tok + stray + b"\r\n",
        b"Authorization: " + stray + b"Bearer " + tok + b"\r\n",
        b"Authorization: Bearer " + tok + b"\r\nAuthorization: Bearer " + tok + stray + b"\r\n",
        b"Authorization: Bearer\r\n " + tok + b"\r\n",  # obs-fold
        b"Authorization: Bearer " + tok[:cut] + b"\n" + tok[cut:] + b"\r\n",
        b"Authorization: Bearer " + tok[:cut] + b"\r" + tok[cut:] + b"\r\n",
        b"Authorization : Bearer " + tok + b"\r\n",
        b"Authorization: Bearer " + tok + b"\xff\xfe\r\n",
        b"Authorization: Bearer " + tok * 300 + b"\r\n",
        b"X-Api-Key: " + tok + stray + b"\r\n",
        tok + stray + b": 1\r\n",
        b"Authorization: Basic " + tok + stray + b"\r\n",
    ]
    head = b"Authorization: Bearer " + tok + b"\r\n"
    body = b""
    shape = rng.choice(shapes)
    if rng.random() < 0.3:
        head, shape = shape, head  # the hostile line first, the clean one after
    method = rng.choice([b"GET", b"GET", b"HEAD", b"POST", b"BREW", b"get"])
    if method == b"POST":
        body = b'{"paths": ["ds/small.bin"]}'
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    version = rng.choice([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0"])
    payload = (method + b" " + rng.choice(targets) + b" " + version + b"\r\nHost: fuzz\r\n"
               + head + shape + b"Connection: close\r\n\r\n" + body)
    if rng.random() < 0.2:  # and a byte flipped somewhere
        at = rng.randrange(len(payload))
        payload = payload[:at] + bytes([payload[at] ^ (1 << rng.randrange(8))]) + payload[at + 1:]
    return payload


async def everything_answered(port: int, payload: bytes, wait: float = 2.0) -> bytes:
    """Every byte the server sends back to ``payload`` (which asks it to close), until it
    closes, or ``wait`` seconds after the last byte."""
    reader, writer = await asyncio.open_connection(HOST, port)
    received = b""
    try:
        # ``wait`` seconds of silence end it as a close does.
        with suppress(ConnectionError, TimeoutError):
            writer.write(payload)
            await writer.drain()
            while data := await asyncio.wait_for(reader.read(1 << 16), wait):
                received += data
    finally:
        writer.close()
        with suppress(Exception):
            await writer.wait_closed()
    return received


def secrets_in(tokens: list[str]) -> list[bytes]:
    """What of each token must not appear anywhere: the whole, and each of its parts
    (claims, signature) long enough to be telling."""
    return [part.encode() for token in tokens for part in (token, *token.split("."))
            if len(part) >= 16]


@pytest.fixture
def token_servers(dataset: Dataset, tmp_path: Path) -> collections.abc.Iterator[
        list[tuple[str, Process]]]:
    from protocol.auth import issue

    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    hub_token = tmp_path / "hub-token"
    hub_token.write_text(issue(secret.read_bytes().strip(), "spoke", [""], admin=False,
                               ttl_s=3600, now=time.time()) + "\n")
    auth = ["--auth-secret-file", str(secret), "--log-level", "debug"]
    started: list[tuple[str, Process]] = []
    try:
        hub = start_process("hub", ["--root", str(dataset[0]), "--chunk-size", "64KiB", *auth],
                            log_dir=str(tmp_path))
        started.append(("hub", hub))
        for workers in ("1", "2"):
            started.append((f"spoke --workers {workers}", start_process("spoke", [
                "--hub", hub.url, "--cache-dir", str(tmp_path / f"cache-{workers}"),
                "--capacity", "16MiB", "--hub-token-file", str(hub_token),
                "--workers", workers, *auth], log_dir=str(tmp_path))))
        yield started
    finally:
        for _, server in reversed(started):
            server.stop()


async def test_tokens_never_reach_a_log_or_an_answer(
    token_servers: list[tuple[str, Process]], tmp_path: Path,
) -> None:
    from protocol.auth import issue

    secret = (tmp_path / "secret").read_bytes().strip()
    rng = random.Random(f"{SEED}-tokens")
    tokens: list[str] = []
    leaks: list[str] = []
    for name, server in token_servers:
        port = int(server.url.rsplit(":", 1)[1])
        targets = [b"/objects/ds/small.bin", b"/objects/ds/big.bin", b"/list/ds/", b"/healthz"]
        targets += [b"/manifest/ds/small.bin"] if name == "hub" else [b"/warm", b"/stats"]
        gate = asyncio.Semaphore(16)

        async def send(payload: bytes, port: int, gate: asyncio.Semaphore) -> bytes:
            async with gate:
                return await everything_answered(port, payload)

        payloads = []
        for i in range(TOKEN_REQUESTS_PER_SERVER):
            # Valid tokens (an admin's, a reader's) and made-up ones of the same shape.
            token = issue(secret, f"tenant-{i}", ["ds/"], admin=i % 3 == 0, ttl_s=3600,
                          now=time.time()) if i % 2 else f"v1.{os.urandom(24).hex()}.fake"
            tokens.append(token)
            payloads.append(hostile_token_requests(rng, token, targets))
        answers = await asyncio.gather(*(send(p, port, gate) for p in payloads))
        assert answers, f"{name} answered nothing"
        everything = b"".join(answers)
        leaks += [f"{name} answered {s[:24]!r}..." for s in secrets_in(tokens) if s in everything]
    for name, server in token_servers:
        server.stop()  # everything it would log is logged
        log = "\n".join(server.log).encode()
        leaks += [f"{name} logged {s[:24]!r}..." for s in secrets_in(tokens) if s in log]
    assert not leaks, "\n".join(leaks[:20])
