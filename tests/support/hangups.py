"""What the hang-up tests share: a loader process that closes each connection the moment
it has its answer (:mod:`tests.support.hangup_client`) while the server's loop is held up,
the access log captured in memory, and the server's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import mmap
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from service import logs
from service.access_buffer import AccessBuffer, OrderedStreamHandler
from tests.support.hangup_client import CLOSED_BYTES

ROUNDS = 50
PAUSE_S = 0.01  # the longest the loop is held up at a time
POLL_S = 0.0002
WAIT_S = 20.0
# Cut short: answers too large for the sockets' buffers to hold (the kernel would
# otherwise take all of one before the client leaves, and it would be whole to the
# server), of which the client reads the first CUT_AT bytes.
HUGE = "ds/huge.bin"
HUGE_BYTES = 48 << 20
CUTS = 10
CUT_AT = 1 << 20

AccessLines = Callable[[], list[dict[str, Any]]]


def capture_access_log(monkeypatch: pytest.MonkeyPatch) -> AccessLines:
    """The buffered access log (``--access-log buffered``, the default), into memory: a
    call of the result flushes it and gives every line so far."""
    stream = io.StringIO()
    handler = OrderedStreamHandler(stream)
    buffer = AccessBuffer(handler, "json")
    handler.buffer = buffer
    monkeypatch.setattr(logs, "_buffer", buffer)

    def lines() -> list[dict[str, Any]]:
        buffer.flush()
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    return lines


@contextlib.asynccontextmanager
async def loop_paused_while_answers_go(closed: mmap.mmap) -> AsyncIterator[None]:
    """The loop runs, but in turns with a callback that blocks it (sleeping, so the
    sendfile threads run on) until the client has closed one more connection, or for
    :data:`PAUSE_S` at most: a reply's last bytes go from the thread, the client reads
    them and closes, and only then does the loop see either."""
    loop = asyncio.get_running_loop()
    pausing = True

    def pause() -> None:
        if not pausing:  # over: the counter may be gone
            return
        until = time.monotonic() + PAUSE_S
        seen = closed[:CLOSED_BYTES]
        while time.monotonic() < until and closed[:CLOSED_BYTES] == seen:
            time.sleep(POLL_S)
        loop.call_soon(pause)

    loop.call_soon(pause)
    try:
        yield
    finally:
        pausing = False


async def hang_up_after_reading(
    url: str, target: str, byte_range: str, tmp_path: Path, rounds: int = ROUNDS,
    keep: int | None = None,
) -> list[tuple[int, int]]:
    """``rounds`` answers read whole (or their first ``keep`` bytes) by
    :mod:`tests.support.hangup_client`, each connection closed by the client the moment
    it has them, while the loop is held up: (status, bytes) each."""
    counter = tmp_path / "closed.u64"
    counter.write_bytes(bytes(CLOSED_BYTES))
    with counter.open("r+b") as f, mmap.mmap(f.fileno(), CLOSED_BYTES) as closed:
        async with loop_paused_while_answers_go(closed):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.support.hangup_client", url, target, byte_range,
                str(rounds), str(counter), *([] if keep is None else [str(keep)]),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2],
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 120)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    return [(int(s), int(n)) for s, n in (line.split() for line in out.decode().splitlines())]


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


async def hangups_reach(
    http: aiohttp.ClientSession, url: str, name: str, value: float
) -> dict[str, float]:
    """The server's metrics once ``name`` (its hang-ups) reaches ``value``, or after
    :data:`WAIT_S` (the test then fails on them)."""
    seen = await metrics(http, url)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_S):
            while seen.get(name, 0.0) < value:
                await asyncio.sleep(0.05)
                seen = await metrics(http, url)
    return seen


async def logged(access_log: AccessLines, target: str, since: int) -> list[tuple[int, int]]:
    """(status, bytes) of each line logged for ``target`` after the first ``since``
    lines, once there are :data:`ROUNDS` of them (or :data:`WAIT_S` went by: the test
    then fails on what there is)."""
    lines: list[tuple[int, int]] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_S):
            while True:
                lines = [(line["status"], line["bytes"]) for line in access_log()[since:]
                         if line["path"] == target]
                if len(lines) >= ROUNDS:
                    break
                await asyncio.sleep(0.05)
    return lines


def huge(root: Path) -> None:
    """:data:`HUGE` under ``root``: sparse, so its bytes cost no disk."""
    path = root / HUGE
    path.touch()
    os.truncate(path, HUGE_BYTES)


def changed(before: dict[str, float], after: dict[str, float], *names: str) -> list[float]:
    return [after.get(name, 0.0) - before.get(name, 0.0) for name in names]



def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def count_once_back(count: Callable[[], int], before: int) -> int:
    """``count()`` once it is back at ``before`` (or :data:`WAIT_S` went by: the test then
    fails on what it is)."""
    now = count()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_S):
            while now != before:
                await asyncio.sleep(0.05)
                now = count()
    return now


def open_sockets() -> int:
    """The process's socket descriptors (not its pipes: a relay thread opens one only once
    its answer's first bytes went)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # one closed while the list was read
            count += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
    return count


async def stalled_client(
    url: str, target: str, *fields: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose answer's head came and whose body is not read: the thread
    sending it waits on the full socket."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    lines = [f"GET {target} HTTP/1.1", "Host: x", *fields, "", ""]
    writer.write("\r\n".join(lines).encode())
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    return reader, writer
