"""Structured logs: one JSON line per request, the request id forwarded to the hub."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.support.servers import Process, start_process


def json_lines(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_request_id_ties_spoke_and_hub_logs(
    dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    root, files = dataset
    hub = await asyncio.to_thread(
        start_process, "hub", ["--root", str(root), "--chunk-size", "64KiB", "--log-format",
                               "json"], log_dir=str(tmp_path))
    spoke = None
    try:
        spoke = await asyncio.to_thread(
            start_process, "spoke", ["--hub", hub.url, "--cache-dir", str(tmp_path / "c"),
                                     "--capacity", "16MiB", "--log-format", "json"],
            log_dir=str(tmp_path))
        async with aiohttp.ClientSession() as http:
            headers = {"X-Request-Id": "loader-42", "Range": "bytes=0-99"}
            async with http.get(f"{spoke.url}/objects/ds/big.bin", headers=headers) as resp:
                assert await resp.read() == files["ds/big.bin"][:100]
                assert resp.headers["X-Request-Id"] == "loader-42"
            async with http.get(f"{spoke.url}/healthz") as resp:
                generated = resp.headers["X-Request-Id"]
                assert generated and generated != "loader-42"
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()
    spoke_access = [e for e in json_lines(spoke.log) if e["logger"] == "hubspoke.access"]
    read = next(e for e in spoke_access if e["request_id"] == "loader-42")
    assert (read["method"], read["path"], read["status"], read["x_cache"]) == (
        "GET", "/objects/ds/big.bin", 206, "MISS")
    assert isinstance(read["duration_ms"], float)
    hub_access = [e for e in json_lines(hub.log) if e["logger"] == "hubspoke.access"]
    forwarded = {(e["path"], e["request_id"]) for e in hub_access}
    # The manifest and the chunk fetch the loader's read caused carry its id.
    assert ("/manifest/ds/big.bin", "loader-42") in forwarded
    assert ("/objects/ds/big.bin", "loader-42") in forwarded
    assert all(line.startswith("{") for line in spoke.log if line.strip()
               and not line.startswith("listening on"))


# Malformed in every way the front door knows: a control byte in a field line (the
# 21-byte request below once cost 592 bytes of traceback), an unknown method, HTTP/2.0,
# a TLS hello, NUL in a value, a control byte in the target.
MALFORMED = [
    b"GET / HTTP/1.1\r\n\x01\r\n\r\n", b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", bytes.fromhex("160301020001"),
    b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
]
ROUNDS = 50  # of each malformed request
HANGUPS = 8  # of each kind
HUGE = "ds/huge.bin"  # far larger than any socket buffer: an answer to it is never all sent
# A handful of lines, whatever the number of requests.
MAX_LOGGED_BYTES = 2048


async def send_and_close(url: str, payload: bytes, then: bytes | None = None) -> bytes:
    """Send ``payload`` on a new connection and read the answer to its end; with
    ``then``, read only the answer's first bytes, send ``then`` and hang up. Returns
    what was read."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(payload)
        async with asyncio.timeout(30):
            if then is None:
                return await reader.read()
            start = await reader.read(1 << 10)
            writer.write(then)
            await writer.drain()
            return start
    finally:
        writer.transport.abort()  # unread bytes and all: a hang-up (RST)


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def until_counted(url: str, name: str, at_least: float) -> float:
    async with asyncio.timeout(30):
        while True:
            value = await asyncio.to_thread(metric, url, name)
            if value >= at_least:
                return value
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def hub_and_spoke(
    root: Path, tmp_path: Path, *spoke_args: str
) -> AsyncIterator[tuple[Process, Process]]:
    """A hub (access log off) over ``root`` with :data:`HUGE` added, and a spoke in
    front of it, as processes whose logs the test reads."""
    (root / HUGE).touch()
    os.truncate(root / HUGE, 48 << 20)  # sparse: its bytes cost no disk
    hub = await asyncio.to_thread(
        start_process, "hub", ["--root", str(root), "--chunk-size", "4MiB", "--access-log", "off"],
        log_dir=str(tmp_path))
    spoke = None
    try:
        spoke = await asyncio.to_thread(
            start_process, "spoke", ["--hub", hub.url, "--cache-dir", str(tmp_path / "c"),
                                     "--capacity", "128MiB", *spoke_args],
            log_dir=str(tmp_path))
        yield hub, spoke
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()


async def test_malformed_input_and_hangups_are_counted_not_logged_at_length(
    dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    async with hub_and_spoke(dataset[0], tmp_path, "--access-log", "off") as (hub, spoke):
        for name, server in (("hub", hub), ("spoke", spoke)):
            logged = len("\n".join(server.log))
            for _ in range(ROUNDS):
                await asyncio.gather(*(send_and_close(server.url, m) for m in MALFORMED))
            # Gone in the middle of an answer, and (on the spoke, which takes bodies) in
            # the middle of a request's body, once its handler reads it (100 Continue).
            hangups = [(f"GET /objects/{HUGE} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), b"")]
            if name == "spoke":
                hangups.append((b"POST /plans HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                b"application/json\r\nContent-Length: 100000\r\n"
                                b"Expect: 100-continue\r\n\r\n", b'{"reads": [["ds/'))
            for payload, then in hangups:
                for _ in range(HANGUPS):
                    await send_and_close(server.url, payload, then)
            await until_counted(server.url, f"{name}_requests_refused_total",
                                ROUNDS * len(MALFORMED))
            await until_counted(server.url, f"{name}_client_hangups_total",
                                HANGUPS * len(hangups))
            added = "\n".join(server.log)[logged:]
            assert "Traceback" not in added and "never retrieved" not in added, added[:2000]
            assert len(added) < MAX_LOGGED_BYTES, added[:2000]


def process_of(answer: bytes) -> bytes:
    """The process that answered: request ids start with a per-process prefix."""
    return answer.partition(b"X-Request-Id: ")[2][:8]


async def test_hangups_on_reader_workers_are_counted_in_the_owners_metrics(
    dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    async with hub_and_spoke(dataset[0], tmp_path, "--workers", "2") as (_, spoke):
        get = f"GET /objects/{HUGE} HTTP/1.1\r\nHost: x\r\n".encode()
        await send_and_close(spoke.url, get + b"Connection: close\r\n\r\n")  # all cached now
        owner = process_of(await send_and_close(
            spoke.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        # Plain reads, the readers' to answer once they know the chunks; the owner's
        # (and counted there) until then, or when the kernel gives it the connection.
        plain = get + f"Range: bytes=0-{(48 << 20) - 1}\r\n\r\n".encode()
        on_readers = sent = 0
        while on_readers < 8:
            assert sent < 500, f"{sent} reads, {on_readers} answered by reader workers"
            start = await send_and_close(spoke.url, plain, then=b"")
            on_readers += process_of(start) != owner
            sent += 1
        await until_counted(spoke.url, "spoke_client_hangups_total", sent)
        assert "Traceback" not in "\n".join(spoke.log)
