"""What a request meets before a route, over raw sockets to a real hub and spoke (the
spoke with one process, and with reader workers, whose fast path also reads heads).

RFC 9110 and 9112: an HTTP version other than 1.x gets 505, an unknown method 501, a
known one a route does not take 405 with ``Allow``; garbage and TLS hellos get 400 at
once; every refusal is problem+json in HTTP/1.1, quotes nothing of the request, and
closes; and ``Connection: close`` ends the connection after that request's answer,
the answers before it all sent (§9.6).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SpokeFactory
from tests.support.servers import RunningServer, start_process

Dataset = tuple[Path, dict[str, bytes]]
# Well past any answer, well short of the header timeout the servers get here: a
# server that waits for more bytes instead of answering shows up as no answer.
HEADER_TIMEOUT_S = 60.0
READ_DEADLINE_S = 30.0
# Reader workers share the port with the owner; the kernel picks one per connection.
CONNECTIONS = 8


@dataclass
class Answer:
    version: bytes
    status: int
    fields: dict[str, str]
    body: bytes


@pytest.fixture(params=["hub", "spoke", "spoke-workers"])
async def port(
    request: pytest.FixtureRequest, hub: RunningServer, make_spoke: SpokeFactory, tmp_path: Path
) -> AsyncIterator[int]:
    if request.param == "hub":
        yield int(hub.url.rsplit(":", 1)[1])
        return
    if request.param == "spoke":
        spoke = await make_spoke(header_timeout_s=HEADER_TIMEOUT_S)
        yield int(spoke.url.rsplit(":", 1)[1])
        return
    workers = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "workers-cache"), "--capacity", "64MiB",
        "--workers", "2", "--header-timeout", str(HEADER_TIMEOUT_S), "--access-log", "off",
    ])
    try:
        yield int(workers.url.rsplit(":", 1)[1])
    finally:
        await asyncio.to_thread(workers.stop)


async def converse(port: int, payload: bytes) -> tuple[list[Answer], bool]:
    """Send ``payload`` on a new connection; the answers until the server closed it
    (and whether it did, within the deadline)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    answers: list[Answer] = []
    closed = False
    try:
        # The deadline ends the conversation: a server that keeps it open is not closed.
        with suppress(TimeoutError):
            async with asyncio.timeout(READ_DEADLINE_S):
                while True:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError as exc:
                        assert not exc.partial, f"a head cut short: {exc.partial!r}"
                        closed = True
                        break
                    answers.append(await _answer(reader, head))
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()
    return answers, closed


async def _answer(reader: asyncio.StreamReader, head: bytes) -> Answer:
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    fields = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines)}
    body = await reader.readexactly(int(fields.get("content-length", "0")))
    return Answer(version.encode(), int(status), fields, body)


def assert_refused(answers: list[Answer], closed: bool, status: int, payload: bytes) -> None:
    """One problem+json answer of ``status`` in HTTP/1.1, then the connection closed,
    and nothing of ``payload`` quoted."""
    assert [(a.version, a.status) for a in answers] == [(b"HTTP/1.1", status)], answers
    [answer] = answers
    assert answer.fields["content-type"].startswith("application/problem+json")
    doc = json.loads(answer.body)
    assert doc["status"] == status and doc["title"] and doc["detail"]
    assert answer.fields.get("connection") == "close" and closed
    line = payload.split(b"\r\n")[0]
    assert line[:16] not in answer.body and b"secret-" not in answer.body, answer.body


async def refused(port: int, payload: bytes, status: int) -> None:
    for _ in range(CONNECTIONS):
        assert_refused(*await converse(port, payload), status, payload)


async def test_a_version_other_than_1x_gets_505(port: int) -> None:
    for version in (b"HTTP/2.0", b"HTTP/3.0", b"HTTP/0.9"):
        await refused(port, b"GET /healthz " + version + b"\r\nHost: x\r\n\r\n", 505)
    await refused(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505)


async def test_an_unknown_method_gets_501_and_a_known_one_405_with_allow(port: int) -> None:
    for method in (b"BREW", b"get", b"PROPFIND", b"M-SEARCH"):
        await refused(port, method + b" /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n", 501)
    answers, _ = await converse(port, b"PUT /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Length: 0\r\nConnection: close\r\n\r\n")
    assert [a.status for a in answers] == [405]
    assert answers[0].fields["allow"].replace(" ", "").split(",") == ["GET", "HEAD"]
    assert answers[0].fields["content-type"].startswith("application/problem+json")


async def test_what_aiohttp_refuses_is_problem_json_too_and_quotes_nothing(port: int) -> None:
    for bad in (b"X-Secret: secret-\x01value\r\n", b"secret-\x01: 1\r\n",
                b"X-A: secret-\x00b\r\n", b"X-A: secret-\rb\r\n"):
        await refused(port, b"GET /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n" + bad
                      + b"\r\n", 400)


async def test_garbage_and_tls_hellos_get_400_at_once(port: int) -> None:
    hello = bytes.fromhex("16030100a5010000a10303") + bytes(range(32)) * 5
    for garbage in (hello, b"\x00\x01\x02\x03", b"\xff\xfe", b"{\"json\": 1}"):
        await refused(port, garbage, 400)


async def test_connection_close_ends_after_its_answer_and_all_before_it(port: int) -> None:
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    read = b"GET /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n"
    close = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for after in (get, b"BREW / HTTP/1.1\r\n\r\n", b"\x16\x03\x01garbage"):
        for _ in range(CONNECTIONS):
            answers, closed = await converse(port, read + get + close + after)
            assert [a.status for a in answers] == [206, 200, 200] and closed, answers
            assert answers[-1].fields.get("connection") == "close"
