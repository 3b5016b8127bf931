"""One HTTP/1.1 exchange over a raw socket, for tests that must tell a status from a cut.

A client library hides how an answer ended; this one reports it: the status and
fields as sent, the body as far as it came, and whether it came whole (as long as
its ``Content-Length``) or the connection closed first (a cut).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import NamedTuple

READ_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes
    complete: bool  # False: the connection closed before the body was whole

    def describe(self) -> str:
        """For an assertion message: what came, without the body's bytes."""
        return f"{self.status} {self.headers} body {len(self.body)} bytes, complete {self.complete}"


def request(target: str, *fields: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_answer(reader: asyncio.StreamReader, method: str = "GET") -> RawAnswer:
    """The next answer on ``reader``, however it ended."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:] if ln)}
    length = 0 if method == "HEAD" else int(headers.get("content-length", "0"))
    body = bytearray()
    with contextlib.suppress(ConnectionError):  # an abort (RST): the body stays as it came
        while len(body) < length:
            data = await asyncio.wait_for(reader.read(length - len(body)), READ_TIMEOUT_S)
            if not data:
                break
            body += data
    return RawAnswer(status, headers, bytes(body), len(body) == length)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection to ``url`` (``http://host:port``)."""
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """The next answer on ``reader``, which must come whole: a cut raises
    (``IncompleteReadError``), where :func:`read_answer` reports it."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
    return status, headers, body


async def exchange(url: str, *requests: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``requests`` pipelined on one new connection to ``url``; their whole
    answers, in order."""
    reader, writer = await connect(url)
    writer.write(b"".join(requests))
    try:
        return [await read_response(reader) for _ in requests]
    finally:
        writer.close()


class RawResponse(NamedTuple):
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes  # all that came before the server closed


async def raw_request(url: str, target: str, *fields: str, method: str = "GET") -> RawResponse:
    """Send ``target`` byte for byte as the request-target (no client-side
    normalisation) on a new connection to ``url``; read until the server closes."""
    reader, writer = await connect(url)
    try:
        writer.write(request(target, *fields, "Connection: close", method=method))
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(status_line.split()[1]), headers, body)


async def raw_get(
    url: str, target: str, *fields: str, through_aiohttp: bool = False
) -> RawAnswer:
    """``GET target`` with ``fields`` on a new connection to ``url`` (``http://host:port``).

    ``through_aiohttp``: a spoke's fast path gives a connection to aiohttp for good
    at its first request that is not a read (here ``/healthz``), so the read that
    follows on it is answered by the aiohttp handler instead.
    """
    reader, writer = await connect(url)
    try:
        if through_aiohttp:
            writer.write(request("/healthz"))
            first = await read_answer(reader)
            assert first.status == 200 and first.complete, first.describe()
        writer.write(request(target, *fields))
        return await read_answer(reader)
    finally:
        writer.close()
