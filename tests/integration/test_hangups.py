"""A loader that hangs up the moment it has its whole answer (``Connection: close``, then
its own close): every such answer is logged and counted once, on the hub's fast path
(large ranges sent from a thread) and on the spoke's (warm, by sendfile).

The hang-up used to race the answer's end: a reply sent whole from the hub's sendfile
thread reached the client, which closed, and the close cancelled the answer before its
coroutine resumed to log and count it. To make that order likely rather than lucky, the
servers run on uvloop, as in production, and the loop is held up (a callback that
sleeps) while the thread sends and the client (a process of its own) reads and closes:
uvloop then sees the thread's result and the close in the same turn, and runs the
close's callback before the answer's coroutine resumes. (asyncio's own loop resumes the
coroutine first: on it the race needs a thread late to report.)
"""

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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop

from hub.config import HubConfig
from hub.handlers import SENDFILE_THREADS
from service import logs
from service.access_buffer import AccessBuffer, OrderedStreamHandler
from spoke.config import SpokeConfig
from tests.conftest import CHUNK
from tests.support.hangup_client import CLOSED_BYTES
from tests.support.servers import start_hub, start_spoke
from tests.support.waits import settled_stats

BIG = "ds/big.bin"  # 2.5 MiB: a range of all of it goes by sendfile on both servers
ROUNDS = 50
PAUSE_S = 0.01  # the longest the loop is held up at a time
POLL_S = 0.0002
WAIT_S = 20.0
# Cut short: answers too large for the sockets' buffers to hold (the kernel would
# otherwise take all of one before the client leaves, and it would be whole to the
# server), of which the client reads the first CUT_AT bytes.
HUGE = "ds/huge.bin"
HUGE_BYTES = 48 << 20
HUGE_CHUNK = 4 << 20
CUTS = 10
CUT_AT = 1 << 20

AccessLines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def access_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[AccessLines]:
    """The buffered access log (``--access-log buffered``, the default), into memory: a
    call flushes it and gives every line so far."""
    stream = io.StringIO()
    handler = OrderedStreamHandler(stream)
    buffer = AccessBuffer(handler, "json")
    handler.buffer = buffer
    monkeypatch.setattr(logs, "_buffer", buffer)

    def lines() -> list[dict[str, Any]]:
        buffer.flush()
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    yield lines


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


def test_the_hub_logs_and_counts_each_answer_its_client_hung_up_on_at_once(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(hub_answers_hung_up_on(dataset, access_log, tmp_path))


async def hub_answers_hung_up_on(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    size = len(dataset[1][BIG])
    # The filesystem backend of the hub's own: its fast path answers.
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK))
    try:
        async with aiohttp.ClientSession() as http:
            before, since = await metrics(http, hub.url), len(access_log())
            target = f"/objects/{BIG}"
            read = await hang_up_after_reading(hub.url, target, f"bytes=0-{size - 1}", tmp_path)
            assert read == [(206, size)] * ROUNDS
            assert await logged(access_log, target, since) == [(206, size)] * ROUNDS
            after = await metrics(http, hub.url)
        # Every answer, and the first /metrics request (counted as it came in).
        assert changed(before, after, "hub_requests_total", "hub_bytes_sent_total",
                       "hub_client_hangups_total") == [ROUNDS + 1, ROUNDS * size, 0]
    finally:
        await hub.stop()


def test_a_hub_answer_cut_short_by_its_client_is_a_hang_up_and_not_logged(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(hub_answers_cut_short(dataset, access_log, tmp_path))


async def hub_answers_cut_short(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    try:
        async with aiohttp.ClientSession() as http:
            before, since = await metrics(http, hub.url), len(access_log())
            target = f"/objects/{HUGE}"
            read = await hang_up_after_reading(
                hub.url, target, f"bytes=0-{HUGE_BYTES - 1}", tmp_path, CUTS, CUT_AT)
            assert read == [(206, CUT_AT)] * CUTS
            name = "hub_client_hangups_total"
            after = await hangups_reach(http, hub.url, name, before.get(name, 0.0) + CUTS)
            assert changed(before, after, name) == [CUTS]
            assert [line for line in access_log()[since:] if line["path"] == target] == []
    finally:
        await hub.stop()


def test_the_spoke_logs_and_counts_each_warm_answer_its_client_hung_up_on_at_once(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(spoke_answers_hung_up_on(dataset, access_log, tmp_path))


async def spoke_answers_hung_up_on(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    size = len(dataset[1][BIG])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK))
    spoke = None
    try:
        spoke = await start_spoke(SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
        ))
        target = f"/objects/{BIG}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{spoke.url}{target}") as resp:
                assert await resp.read() == dataset[1][BIG]
            await settled_stats(http, spoke.url)  # every chunk on disk: the reads are warm
            before, since = await metrics(http, spoke.url), len(access_log())
            read = await hang_up_after_reading(
                spoke.url, target, f"bytes=0-{size - 1}", tmp_path)
            assert read == [(206, size)] * ROUNDS
            assert await logged(access_log, target, since) == [(206, size)] * ROUNDS
            after = await metrics(http, spoke.url)
        hits = 'spoke_read_seconds_count{cache="hit",front="http"}'
        assert changed(before, after, "spoke_served_hit_bytes_total", hits,
                       "spoke_client_hangups_total") == [ROUNDS * size, ROUNDS, 0]
    finally:
        if spoke is not None:
            await spoke.stop()
        await hub.stop()


def test_a_warm_spoke_answer_cut_short_by_its_client_is_a_hang_up_and_not_logged(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(spoke_answers_cut_short(dataset, access_log, tmp_path))


async def spoke_answers_cut_short(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    spoke = None
    try:
        spoke = await start_spoke(SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=2 * HUGE_BYTES,
        ))
        target = f"/objects/{HUGE}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{spoke.url}{target}") as resp:
                assert len(await resp.read()) == HUGE_BYTES
            await settled_stats(http, spoke.url)
            before, since = await metrics(http, spoke.url), len(access_log())
            read = await hang_up_after_reading(
                spoke.url, target, f"bytes=0-{HUGE_BYTES - 1}", tmp_path, CUTS, CUT_AT)
            assert read == [(206, CUT_AT)] * CUTS
            name = "spoke_client_hangups_total"
            after = await hangups_reach(http, spoke.url, name, before.get(name, 0.0) + CUTS)
            assert changed(before, after, name) == [CUTS]
            assert [line for line in access_log()[since:] if line["path"] == target] == []
    finally:
        if spoke is not None:
            await spoke.stop()
        await hub.stop()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def stalled_client(
    url: str, target: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose answer's head came and whose body is not read: its sendfile
    thread waits on the full socket."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    return reader, writer


async def test_a_hub_answer_waiting_for_a_sendfile_thread_lets_go_of_its_files_on_a_hang_up(
    dataset: tuple[Path, dict[str, bytes]],
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    target = f"/objects/{HUGE}"
    stalled = []
    try:
        # Every sendfile thread busy with a client that does not read.
        for _ in range(SENDFILE_THREADS):
            stalled.append(await stalled_client(hub.url, target))
        before = open_fds()
        _, writer = await stalled_client(hub.url, target)  # its answer waits for a thread
        writer.close()
        await writer.wait_closed()
        now = open_fds()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WAIT_S):
                while now != before:
                    await asyncio.sleep(0.05)
                    now = open_fds()
        # Its socket, and the copies of socket and file its thread would have closed.
        assert now == before
    finally:
        for _, w in stalled:
            w.close()
        await hub.stop()
