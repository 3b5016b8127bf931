"""The loader client checks a 206's Content-Range before it hands the bytes on.

Our servers only send right ones, so a stand-in on 127.0.0.1 answers every request
with the 206 a test gives it; the client reads it over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from spoke.client import AsyncClient, HubspokeError

DATA = bytes(range(10))
WAIT_S = 10.0


@pytest.fixture
async def answers() -> AsyncIterator[tuple[list[bytes], AsyncClient]]:
    """The answers the stand-in sends, one per request, and a client of it."""
    queue: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # The client hung up: nothing more to answer.
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    writer.write(queue.pop(0))
                    await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncClient(f"http://127.0.0.1:{port}", max_retries=0)
    try:
        yield queue, client
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def partial(content_range: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: {content_range}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@pytest.mark.parametrize("content_range", ["bytes 2-5/10", "bytes 2-5/*", " bytes 2-5/10"])
async def test_a_read_takes_the_range_it_asked_for(
    answers: tuple[list[bytes], AsyncClient], content_range: str
) -> None:
    queue, client = answers
    queue.append(partial(content_range, DATA[2:6]))
    assert await asyncio.wait_for(client.read("ds/a.bin", 2, 4), WAIT_S) == DATA[2:6]


@pytest.mark.parametrize("content_range", [
    "bytes 3-6/10",  # another range
    "bytes 2-5/5",  # last-pos past the length
    "bytes 2-5",  # no length
    "bytes 2-/10",
    "bytes */10",
    "bytes 2 -5/10",
    "items 2-5/10",
])
async def test_a_read_refuses_a_range_it_did_not_ask_for(
    answers: tuple[list[bytes], AsyncClient], content_range: str
) -> None:
    queue, client = answers
    queue.append(partial(content_range, DATA[2:6]))
    with pytest.raises(HubspokeError, match="asked for bytes from 2"):
        await asyncio.wait_for(client.read("ds/a.bin", 2, 4), WAIT_S)


async def test_a_batch_answered_with_one_range_is_cut_from_it(
    answers: tuple[list[bytes], AsyncClient],
) -> None:
    queue, client = answers
    queue.append(partial("bytes 2-7/10", DATA[2:8]))  # the server merged the two
    got = await asyncio.wait_for(client.read_many("ds/a.bin", [(2, 2), (6, 2)]), WAIT_S)
    assert got == [DATA[2:4], DATA[6:8]]


@pytest.mark.parametrize("content_range", ["bytes */10", "bytes 2-7/7", "bytes 7-2/10", ""])
async def test_a_batch_refuses_a_206_without_a_valid_content_range(
    answers: tuple[list[bytes], AsyncClient], content_range: str
) -> None:
    queue, client = answers
    queue.append(partial(content_range, DATA[2:8]))
    with pytest.raises(HubspokeError, match="without a valid Content-Range"):
        await asyncio.wait_for(client.read_many("ds/a.bin", [(2, 2), (6, 2)]), WAIT_S)
