"""What the hub client's chunk connections make of the answers a hub may send.

The real hub only sends well-formed 206s, so a stand-in on 127.0.0.1 answers each
request with the bytes a test gives it: the client's side (reading the head with
:func:`protocol.http1.parse_response_head`, checking its Content-Range, keeping the
connection or not, reading an error body, handing a chunked answer to aiohttp) runs
as it does against the hub, over real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from protocol.ranges import ByteRange
from spoke.upstream.errors import BadGateway, GoneAtHub
from spoke.upstream.hub import HubClient

DATA = bytes(range(10))
ETAG = '"v1"'
WAIT_S = 10.0


class StandIn:
    """Answers each request, on whatever connection it comes, with the next of
    ``answers``; closes a connection after an answer that says it will."""

    def __init__(self) -> None:
        self.answers: list[bytes] = []
        self.connections = 0
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            # The client hung up: nothing more to answer.
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                    answer = self.answers.pop(0)
                    writer.write(answer)
                    await writer.drain()
                    if b"Connection: close" in answer or answer.startswith(b"HTTP/1.0"):
                        break
        finally:
            writer.close()


@pytest.fixture
async def stand_in() -> AsyncIterator[tuple[StandIn, HubClient]]:
    hub = StandIn()
    server = await asyncio.start_server(hub.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HubClient(f"http://127.0.0.1:{port}", connect_timeout_s=WAIT_S,
                       read_timeout_s=WAIT_S, max_connections=4)
    await client.start()
    try:
        yield hub, client
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


class Buffer:
    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.filled = 0

    def space(self) -> memoryview:
        return memoryview(self.data)[self.filled:]

    def advance(self, nbytes: int) -> None:
        self.filled += nbytes


def answer(status: str, *fields: str, body: bytes = b"") -> bytes:
    return ("\r\n".join([status, *fields]) + "\r\n\r\n").encode("latin-1") + body


def chunk(r: ByteRange, *extra: str, content_range: str | None = None) -> bytes:
    """The hub's 206 for bytes ``r`` of DATA."""
    cr = content_range or f"bytes {r.start}-{r.stop - 1}/{len(DATA)}"
    return answer("HTTP/1.1 206 Partial Content", f"ETag: {ETAG}", f"Content-Range: {cr}",
                  f"Content-Length: {r.length}", *extra, body=DATA[r.start:r.stop])


async def fetch(client: HubClient, r: ByteRange, etag: str | None = ETAG) -> bytes:
    target = Buffer(r.length)
    await asyncio.wait_for(client.fetch_into("ds/a.bin", etag, r, target), WAIT_S)
    return bytes(target.data[:target.filled])


R = ByteRange(2, 6)


async def test_a_kept_alive_connection_carries_the_next_fetch(
    stand_in: tuple[StandIn, HubClient],
) -> None:
    hub, client = stand_in
    hub.answers = [chunk(R), chunk(ByteRange(0, 10))]
    assert await fetch(client, R) == DATA[2:6]
    assert await fetch(client, ByteRange(0, 10)) == DATA
    assert hub.connections == 1


@pytest.mark.parametrize("closing", [
    chunk(R, "Connection: close"),
    chunk(R, "Connection: keep-alive, close"),
    chunk(R).replace(b"HTTP/1.1", b"HTTP/1.0", 1),  # RFC 9112 §9.3: 1.0 closes by default
])
async def test_an_answer_that_closes_is_not_reused(
    stand_in: tuple[StandIn, HubClient], closing: bytes,
) -> None:
    hub, client = stand_in
    hub.answers = [closing, chunk(R)]
    assert await fetch(client, R) == DATA[2:6]
    assert await fetch(client, R) == DATA[2:6]
    assert hub.connections == 2


async def test_a_complete_error_answer_leaves_the_connection_usable(
    stand_in: tuple[StandIn, HubClient],
) -> None:
    hub, client = stand_in
    hub.answers = [answer("HTTP/1.1 404 Not Found", "Content-Length: 9", body=b"not found"),
                   chunk(R)]
    with pytest.raises(GoneAtHub):
        await fetch(client, R)
    assert await fetch(client, R) == DATA[2:6]
    assert hub.connections == 1


@pytest.mark.parametrize(("bad", "says"), [
    (chunk(R, content_range="bytes 2-6/10"), "hub answered 'bytes 2-6/10'"),
    (chunk(R, content_range="bytes 2-5/5"), "hub answered 'bytes 2-5/5'"),  # last >= length
    (chunk(R, content_range="bytes 2-5"), "hub answered 'bytes 2-5'"),
    (chunk(R, content_range="bytes ²-5/10"), "hub answered"),
    (answer("HTTP/1.1 2060 Partial", "Content-Length: 0"), "malformed status line"),
    (answer("HTTP/1.1 206 OK", "Content-Length : 4", body=DATA[2:6]), "malformed response header"),
    (answer("HTTP/1.1 206 OK", "Content-Length: 4", " folded", body=DATA[2:6]),
     "malformed response header"),
])
async def test_an_answer_it_cannot_use_is_a_bad_gateway(
    stand_in: tuple[StandIn, HubClient], bad: bytes, says: str,
) -> None:
    hub, client = stand_in
    hub.answers = [bad]
    with pytest.raises(BadGateway, match=says):
        await fetch(client, R)


async def test_a_chunked_answer_is_read_through_aiohttp(
    stand_in: tuple[StandIn, HubClient],
) -> None:
    hub, client = stand_in
    chunked = answer("HTTP/1.1 206 Partial Content", f"ETag: {ETAG}",
                     f"Content-Range: bytes 2-5/{len(DATA)}", "Transfer-Encoding: chunked",
                     body=b"2\r\n" + DATA[2:4] + b"\r\n2\r\n" + DATA[4:6] + b"\r\n0\r\n\r\n")
    hub.answers = [chunked, chunked]
    assert await fetch(client, R) == DATA[2:6]
    assert len(hub.requests) == 2  # the chunk connection's, then aiohttp's


async def test_an_answer_of_any_version_says_which_and_where_it_ends(
    stand_in: tuple[StandIn, HubClient],
) -> None:
    hub, client = stand_in
    heard: list[tuple[str, ByteRange]] = []
    hub.answers = [chunk(ByteRange(6, 10), content_range=f"bytes 6-9/{len(DATA)}")]
    target = Buffer(8)
    await asyncio.wait_for(client.fetch_into(
        "ds/a.bin", None, ByteRange(6, 14), target, lambda e, g: heard.append((e, g))), WAIT_S)
    assert (heard, bytes(target.data[:target.filled])) == ([(ETAG, ByteRange(6, 10))], DATA[6:])
