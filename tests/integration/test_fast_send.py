"""How :meth:`service.fast.FastProtocol.send_now` and ``sendfile_now`` send a head and
file bytes: held back with ``MSG_MORE`` to leave with the file's first bytes, and, when
the socket is full, queued on the transport in order. A real
:class:`service.fast.FastServer` on 127.0.0.1, a real client socket, a real file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from protocol.http1 import RequestHead
from service.fast import FastConnection, FastServer, Reply
from service.limits import ConnectionLimits

FILE_BYTES = 300_000
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n"


class FillThenSend:
    """Answers ``GET /full`` after filling the socket itself to the brim (nothing waits
    in the transport: the head meets a full socket), ``GET /free`` at once; both with
    :data:`HEAD` and the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = 0  # bytes written ahead of the answer to fill the socket
        self.sent_now: list[int] = []  # what each sendfile_now sent of the file

    def __call__(self, head: RequestHead, conn: FastConnection) -> Reply | Awaitable[Reply]:
        if head.target.endswith("/full"):
            dup = conn.socket_copy()
            assert dup is not None
            sock = socket.socket(fileno=dup)
            sock.setblocking(False)
            try:
                with contextlib.suppress(BlockingIOError):  # full: what the test wants
                    while True:
                        self.filler += sock.send(b"f" * 65536)
            finally:
                sock.close()
        if head.target == "/now/small":  # a send buffer smaller than the file
            dup = conn.socket_copy()
            assert dup is not None
            with socket.socket(fileno=dup) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
        fd = os.open(self.path, os.O_RDONLY)
        if head.target.startswith("/now"):
            return self._now(conn, fd)
        try:
            assert conn.send_now(HEAD, [(fd, 0, FILE_BYTES)])
        finally:
            os.close(fd)
        return Reply(200, FILE_BYTES)

    def _now(self, conn: FastConnection, fd: int) -> Reply | Awaitable[Reply]:
        """What the socket takes at once within the callback, the rest in a task."""
        sent = conn.sendfile_now(HEAD, fd, 0, FILE_BYTES)
        self.sent_now.append(sent)
        if sent == FILE_BYTES:
            os.close(fd)
            return Reply(200, FILE_BYTES)
        return self._rest(conn, fd, sent)

    async def _rest(self, conn: FastConnection, fd: int, sent: int) -> Reply:
        try:
            if not await conn.sendfile(fd, sent, FILE_BYTES - sent):
                conn.write(os.pread(fd, FILE_BYTES - sent, sent))  # behind the queued head
                await conn.drain()
        finally:
            os.close(fd)
        return Reply(200, FILE_BYTES)


class NoSlowPath:
    def __call__(self) -> object:
        raise AssertionError("the fast path declined a request it was given")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[FillThenSend, int, bytes]]:
    data = os.urandom(FILE_BYTES)
    path = tmp_path / "file.bin"
    path.write_bytes(data)
    handler = FillThenSend(path)
    fast = FastServer(handler, NoSlowPath(), ConnectionLimits(8, 30.0),
                      idle_timeout_s=30.0)
    listener = await asyncio.get_running_loop().create_server(fast, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield handler, port, data
    finally:
        listener.close()
        await fast.shutdown(5.0)


async def _client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def test_a_head_and_its_file_arrive_whole_on_a_free_socket(
    server: tuple[FillThenSend, int, bytes],
) -> None:
    _, port, data = server
    reader, writer = await _client(port)
    writer.write(b"GET /free HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
    for _ in range(3):
        assert await reader.readexactly(len(HEAD)) == HEAD
        assert await reader.readexactly(FILE_BYTES) == data
    writer.close()


async def test_a_head_that_meets_a_full_socket_is_queued_before_its_file(
    server: tuple[FillThenSend, int, bytes],
) -> None:
    handler, port, data = server
    reader, writer = await _client(port)
    writer.write(b"GET /full HTTP/1.1\r\nHost: x\r\n\r\nGET /free HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await reader.readexactly(1)
    assert first == b"f" and handler.filler > 0
    assert await reader.readexactly(handler.filler - 1) == b"f" * (handler.filler - 1)
    for _ in range(2):  # the answer queued behind the filler, then one sent after it
        assert await reader.readexactly(len(HEAD)) == HEAD
        assert await reader.readexactly(FILE_BYTES) == data
    writer.close()


async def test_sendfile_now_sends_what_the_socket_takes_and_the_rest_follows_in_order(
    server: tuple[FillThenSend, int, bytes],
) -> None:
    handler, port, data = server
    reader, writer = await _client(port)
    writer.write(b"GET /now/small HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
    for _ in range(3):
        assert await reader.readexactly(len(HEAD)) == HEAD
        assert await reader.readexactly(FILE_BYTES) == data
    # Each went at once as far as the socket took it, the rest from a task.
    assert len(handler.sent_now) == 3 and 0 < handler.sent_now[0] < FILE_BYTES
    writer.close()


async def test_sendfile_now_on_a_full_socket_queues_the_head_and_sends_nothing_of_the_file(
    server: tuple[FillThenSend, int, bytes],
) -> None:
    handler, port, data = server
    reader, writer = await _client(port)
    writer.write(b"GET /now/full HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await reader.readexactly(1)
    assert first == b"f" and handler.filler > 0
    assert await reader.readexactly(handler.filler - 1) == b"f" * (handler.filler - 1)
    for _ in range(2):  # the head queued behind the filler, its file behind it, the next
        assert await reader.readexactly(len(HEAD)) == HEAD
        assert await reader.readexactly(FILE_BYTES) == data
    assert handler.sent_now[0] == 0
    writer.close()
