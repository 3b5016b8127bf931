"""The per-client cap on requests in flight, on a real hub held behind a gate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from hub.config import HubConfig
from service.fast import has_unread_bytes
from service.limits import CONNECTIONS, LIMIT, ConnectionLimits, InflightLimit
from tests.conftest import CHUNK, SpokeFactory
from tests.security.conftest import Dataset, call, problem
from tests.support.servers import GatedBackend, Process, RunningServer, start_hub, start_process


def test_slots_are_per_client_and_given_back() -> None:
    limit = InflightLimit(2)
    assert limit.acquire("a") and limit.acquire("a") and not limit.acquire("a")
    assert limit.acquire("b")  # another address has its own slots
    limit.release("a")
    assert limit.acquire("a")
    for client in ("a", "a", "b"):
        limit.release(client)
    assert limit.rejected == 1 and limit.series("x")[1].read() == 0


async def test_requests_over_the_cap_get_429_and_are_counted(
    dataset: Dataset, gated: GatedBackend, http: aiohttp.ClientSession
) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_inflight_per_client=2), gated
    )
    try:
        gated.gate.clear()
        held = [asyncio.create_task(call(http, f"{hub.url}/objects/ds/small.bin"))
                for _ in range(2)]
        for _ in held:  # both are inside the handler, blocked on the backend
            await asyncio.to_thread(gated.waiting.acquire, timeout=10)
        response = await call(http, f"{hub.url}/objects/ds/small.bin")
        problem(response, 429)
        assert response[1]["Retry-After"] == "1"
        gated.gate.set()
        assert [status for status, _, _ in await asyncio.gather(*held)] == [200, 200]
        for _ in range(200):  # slots are given back just after the client has its answer
            if not hub.app[LIMIT].in_flight():
                break
            await asyncio.sleep(0.01)
        status, _, body = await call(http, f"{hub.url}/metrics")
        assert status == 200 and b"hub_limit_inflight_rejected_total 1.0" in body
        # The server releases a slot just after the client has the whole answer.
        statuses = []
        for _ in range(50):
            statuses.append((await call(http, f"{hub.url}/objects/ds/small.bin"))[0])
            if statuses[-1] == 200:
                break
            await asyncio.sleep(0.02)
        assert statuses[-1] == 200 and set(statuses) <= {200, 429}
    finally:
        gated.gate.set()
        await hub.stop()


@pytest.mark.parametrize("value", [0, -1])
async def test_zero_turns_the_cap_off(dataset: Dataset, value: int) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_inflight_per_client=value)
    )
    try:
        assert LIMIT not in hub.app
    finally:
        await hub.stop()


# --- open connections per client, and the header-read timeout (slowloris) -------------

GET_SMALL = b"GET /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"


def _port(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def _closed_after(reader: asyncio.StreamReader, limit_s: float) -> float | None:
    """Seconds until the server closes the connection (None: still open after ``limit_s``)."""
    started = loop_time()
    try:
        while True:
            data = await asyncio.wait_for(reader.read(1 << 16), limit_s - (loop_time() - started))
            if not data:
                return loop_time() - started
    except TimeoutError:
        return None
    except ConnectionError:
        return loop_time() - started


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), 5)
    return head


async def test_slowloris_is_cut_after_the_header_timeout_while_others_are_served(
    dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK, header_timeout_s=0.5))
    port = _port(hub)
    try:
        async def slowloris(first: bytes, drip: bytes = b"") -> float | None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(first)
                if drip:  # one byte every 0.1 s: busy, but never a complete request
                    async def dribble() -> None:
                        with contextlib.suppress(ConnectionError):
                            for byte in drip:
                                await asyncio.sleep(0.1)
                                writer.write(bytes([byte]))
                    task = asyncio.create_task(dribble())
                closed = await _closed_after(reader, 3.0)
                if drip:
                    task.cancel()
                return closed
            finally:
                writer.close()

        async def keepalive_then_partial() -> float | None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(GET_SMALL)
                assert b" 200 " in await _read_response(reader)
                await asyncio.sleep(0.8)  # idle keep-alive is not a slow header
                writer.write(GET_SMALL)
                assert b" 200 " in await _read_response(reader)
                writer.write(b"GET /objects/ds/small.bin HTTP/1.1\r\nHo")
                return await _closed_after(reader, 3.0)
            finally:
                writer.close()

        async def normal_client() -> list[int]:
            statuses = []
            for _ in range(15):
                statuses.append((await call(http, f"{hub.url}/objects/ds/small.bin"))[0])
                await asyncio.sleep(0.1)
            return statuses

        results = await asyncio.gather(
            slowloris(b""),  # connects, sends nothing
            slowloris(b"GET /objects/ds/small.bin HTTP/1.1\r\n"),  # half a request
            slowloris(b"GET /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\n", drip=b"X-A: 1" * 5),
            slowloris(GET_SMALL + b"GET /objects/ds/sm"),  # one request, then half of the next
            keepalive_then_partial(),
            normal_client(),
        )
        *cut, statuses = results
        assert statuses == [200] * 15
        for seconds in cut:
            assert seconds is not None and 0.4 <= seconds < 2.0, cut
        limits = hub.app[CONNECTIONS]
        assert limits.header_timeouts == 5
        status, _, body = await call(http, f"{hub.url}/metrics")
        assert status == 200 and b"hub_limit_header_timeouts_total 5.0" in body
    finally:
        await hub.stop()


async def test_a_slow_body_is_not_a_slow_header(make_spoke: SpokeFactory) -> None:
    """The timeout covers request headers only: a body may take its time."""
    spoke = await make_spoke(header_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(spoke))
    try:
        body = b'{"paths": ["ds/small.bin"]}'
        writer.write(b"POST /warm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 4):
            await asyncio.sleep(0.05)  # 0.35 s in all
            writer.write(body[i:i + 4])
        assert b" 202 " in await _read_response(reader)
        # Idle now, past the header timeout: not a slow header either (the body's last
        # bytes are not the start of another request).
        await asyncio.sleep(1.0)
        writer.write(GET_SMALL)
        assert b" 200 " in await _read_response(reader)
        assert spoke.app[CONNECTIONS].header_timeouts == 0
    finally:
        writer.close()


async def test_connections_over_the_cap_are_closed_and_counted_when_none_is_idle(
    dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_connections_per_client=3)
    )
    port = _port(hub)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        # Each in the middle of a request (half its head sent): busy, not idle.
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for _, writer in held:
            writer.write(GET_SMALL[:20])
        limits = hub.app[CONNECTIONS]
        for _ in range(200):  # the server has read them all
            if sum(conn.idle_at() is None for conn in limits._open.get("127.0.0.1", {})) == 3:
                break
            await asyncio.sleep(0.01)
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for reader, writer in extra:
            with contextlib.suppress(ConnectionError):
                writer.write(GET_SMALL)
            assert await _closed_after(reader, 2.0) is not None  # closed, nothing answered
            writer.close()
        assert (limits.refused, limits.idle_closed) == (2, 0)
        for reader, writer in held:  # the first three are served as usual
            writer.write(GET_SMALL[20:])
            assert b" 200 " in await _read_response(reader)
        for _, writer in held:
            writer.close()
        held = []
        for _ in range(100):  # the server sees them go
            if not limits.series("x")[2].read():
                break
            await asyncio.sleep(0.02)
        status, _, body = await call(http, f"{hub.url}/metrics")
        assert status == 200
        assert b"hub_limit_connections_refused_total 2.0" in body
        assert b"hub_limit_connections_open 1.0" in body  # this scrape's own connection
    finally:
        for _, writer in held:
            writer.close()
        await hub.stop()


class _Conn:
    """A connection as the cap sees it, idle since ``idle`` (None: busy)."""

    def __init__(self, idle: float | None = None) -> None:
        self.idle, self.closed = idle, False

    def idle_at(self) -> float | None:
        return self.idle

    def close_idle(self) -> None:
        self.closed = True


def test_connection_slots_are_per_client_and_given_back() -> None:
    limits = ConnectionLimits(max_per_client=2, header_timeout_s=0)
    a1, a2, a3, b1 = _Conn(), _Conn(), _Conn(), _Conn()
    assert limits.open("a", a1) and limits.open("a", a2) and not limits.open("a", a3)
    assert limits.open("b", b1)
    limits.close("a", a1)
    assert limits.open("a", a3)
    for client, conn in (("a", a2), ("a", a3), ("b", b1)):
        limits.close(client, conn)
    assert limits.refused == 1 and limits.series("x")[2].read() == 0


def test_at_the_cap_the_least_recently_active_idle_connection_makes_room() -> None:
    limits = ConnectionLimits(max_per_client=3, header_timeout_s=0)
    busy, recent, idlest = _Conn(None), _Conn(20.0), _Conn(10.0)
    for conn in (busy, recent, idlest):
        assert limits.open("a", conn)
    newcomer = _Conn()
    assert limits.open("a", newcomer)
    assert (idlest.closed, recent.closed, busy.closed) == (True, False, False)
    limits.close("a", idlest)  # its connection_lost, later: already uncounted
    assert limits.series("x")[2].read() == 3 and limits.idle_closed == 1
    recent.idle = None  # now every connection is busy: the next one is refused
    assert not limits.open("a", _Conn()) and limits.refused == 1


async def test_zero_turns_the_connection_limits_off(dataset: Dataset) -> None:
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK,
                                    max_connections_per_client=0, header_timeout_s=0))
    try:
        assert CONNECTIONS not in hub.app
        # The front door stays: a refusal is still problem+json in HTTP/1.1.
        reader, writer = await asyncio.open_connection(*hub.url.removeprefix("http://").split(":"))
        writer.write(b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 501 ") and b"application/problem+json" in answer
    finally:
        await hub.stop()


def test_limit_flags_and_environment() -> None:
    from hub.config import parse_config
    from spoke.config import config_from_args, parse_args

    _, hub = parse_config(["serve", "--root", "/r"], {})
    assert (hub.max_connections_per_client, hub.header_timeout_s, hub.keepalive_timeout_s) \
        == (256, 10.0, 75.0)
    _, hub = parse_config(["serve", "--root", "/r", "--max-connections-per-client", "7",
                           "--header-timeout", "2.5", "--keepalive-timeout", "30"],
                          {"HUBSPOKE_HEADER_TIMEOUT": "9"})
    assert (hub.max_connections_per_client, hub.header_timeout_s, hub.keepalive_timeout_s) \
        == (7, 2.5, 30.0)
    spoke = config_from_args(parse_args(
        ["serve", "--hub", "http://h", "--cache-dir", "/c", "--capacity", "1GiB"],
        {"HUBSPOKE_MAX_CONNECTIONS_PER_CLIENT": "9", "HUBSPOKE_HEADER_TIMEOUT": "0.5",
         "HUBSPOKE_KEEPALIVE_TIMEOUT": "20"}))
    assert (spoke.max_connections_per_client, spoke.header_timeout_s,
            spoke.keepalive_timeout_s) == (9, 0.5, 20.0)
    with pytest.raises(SystemExit):  # bounded: there is no "never"
        parse_config(["serve", "--root", "/r", "--keepalive-timeout", "0"], {})


async def test_the_header_timeout_never_cuts_an_answer_in_flight(dataset: Dataset) -> None:
    """The start of the next request came with this one, arming the header timer; the
    answer then takes longer than the timeout (the hub's read held): it still completes."""
    gated = GatedBackend(str(dataset[0]))
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, header_timeout_s=0.3), gated
    )
    try:
        gated.gate.clear()
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(hub))
        writer.write(GET_SMALL + b"GET /objects/ds/sm")
        assert await asyncio.to_thread(gated.waiting.acquire, True, 5)  # the read is held
        await asyncio.sleep(1.0)  # over three header timeouts
        gated.gate.set()
        assert b" 200 " in await _read_response(reader)
        writer.close()
    finally:
        gated.gate.set()
        await hub.stop()


# --- idle keep-alive connections: the cap closes the idlest, and they time out --------

CAP = 8
WAIT_S = 10.0  # bound on waiting for a server to act; never a measure of its speed


async def _all_gone(limits: ConnectionLimits) -> None:
    """Return once the server has seen every client connection close."""
    for _ in range(int(WAIT_S / 0.01)):
        if not limits.series("x")[2].read():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("client connections still counted open")


async def _kept_alive(port: int, request: bytes = GET_SMALL) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter, bytes
]:
    """A new connection that has had ``request`` answered 2xx, and is now idle."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    head = await _read_response(reader)
    assert head.split(b" ", 2)[1].startswith(b"2"), head
    return reader, writer, head


async def _start_hub_or_spoke(
    kind: str, dataset: Dataset, make_spoke: SpokeFactory, **limits: object
) -> RunningServer:
    if kind == "hub":
        return await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK, **limits))
    return await make_spoke(**limits)


@pytest.mark.parametrize("kind", ["hub", "spoke"])
async def test_a_client_at_its_cap_gets_served_and_its_idlest_connection_closed(
    kind: str, dataset: Dataset, make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    server = await _start_hub_or_spoke(kind, dataset, make_spoke, max_connections_per_client=CAP)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]] = []
    try:
        held = [await _kept_alive(_port(server)) for _ in range(CAP)]  # held[0]: the idlest
        # One more from the same address: answered, and the idlest one makes room.
        newcomer = await _kept_alive(_port(server))
        assert await _closed_after(held[0][0], WAIT_S) is not None
        for reader, writer, _ in [*held[1:], newcomer]:  # the rest are served as before
            writer.write(GET_SMALL)
            assert b" 200 " in await _read_response(reader)
        limits = server.app[CONNECTIONS]
        assert (limits.idle_closed, limits.refused) == (1, 0)
        for _, writer, _ in [*held, newcomer]:
            writer.close()
        held = []
        await _all_gone(limits)  # else the scrape's own connection would make room, too
        status, _, body = await call(http, f"{server.url}/metrics")
        assert status == 200
        assert f"{kind}_limit_connections_idle_closed_total 1.0".encode() in body
    finally:
        for _, writer, _ in held:
            writer.close()
        if kind == "hub":
            await server.stop()


@pytest.mark.parametrize("kind", ["hub", "spoke"])
async def test_idle_keepalive_connections_are_closed_after_the_keepalive_timeout(
    kind: str, dataset: Dataset, make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    server = await _start_hub_or_spoke(kind, dataset, make_spoke, keepalive_timeout_s=0.5)
    try:
        # Answered by the fast path (the spoke's plain reads) and by aiohttp (the hub,
        # and the spoke's other routes): both close the connection once it is idle.
        idle = [await _kept_alive(_port(server)),
                await _kept_alive(_port(server), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")]
        for reader, writer, _ in idle:
            assert await _closed_after(reader, WAIT_S) is not None
            writer.close()
        assert server.app[CONNECTIONS].keepalive_timeouts == 2
        status, _, body = await call(http, f"{server.url}/metrics")
        assert status == 200 and f"{kind}_limit_keepalive_timeouts_total 2.0".encode() in body
    finally:
        if kind == "hub":
            await server.stop()


PARTIAL = b"GET /objects/ds/small.bin HTTP/1.1\r\nHo"


@pytest.mark.parametrize("kind", ["hub", "spoke"])
@pytest.mark.parametrize("first", [
    GET_SMALL,  # the spoke's fast path
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",  # aiohttp's routes
    b"POST /warm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n[]",  # a request with a body (a 4xx on the hub, no route)
], ids=["fast", "aiohttp", "body"])
async def test_a_slow_header_on_a_kept_alive_connection_is_cut(
    kind: str, first: bytes, dataset: Dataset, make_spoke: SpokeFactory
) -> None:
    server = await _start_hub_or_spoke(kind, dataset, make_spoke, header_timeout_s=0.5)
    try:
        # The next request's start after the answer, with the request, or with the last
        # bytes of a request sent in two parts.
        for sends, after in (([first], PARTIAL), ([first + PARTIAL], b""),
                             ([first[:-2], first[-2:] + PARTIAL], b"")):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(server))
            try:
                for data in sends:
                    if data is not sends[0]:
                        await asyncio.sleep(0.05)  # most likely two reads; either will do
                    writer.write(data)
                await _read_response(reader)
                writer.write(after)
                assert await _closed_after(reader, WAIT_S) is not None
            finally:
                writer.close()
        assert server.app[CONNECTIONS].header_timeouts == 3
    finally:
        if kind == "hub":
            await server.stop()


async def test_a_connection_with_bytes_waiting_in_the_kernel_is_not_idle() -> None:
    """A request may be arriving on it: closing it for room would lose that request."""
    accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Paused(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            cast(asyncio.Transport, transport).pause_reading()  # what comes stays in the kernel
            accepted.set_result(cast(asyncio.Transport, transport))

    server = await asyncio.get_running_loop().create_server(Paused, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        transport = await asyncio.wait_for(accepted, WAIT_S)
        assert not has_unread_bytes(transport)
        writer.write(GET_SMALL)
        for _ in range(int(WAIT_S / 0.01)):
            if has_unread_bytes(transport):
                break
            await asyncio.sleep(0.01)
        assert has_unread_bytes(transport)
    finally:
        writer.close()
        if accepted.done():
            accepted.result().close()
        server.close()
        await server.wait_closed()


# --- the same with reader workers: each process of the spoke keeps its own count ------

PLAIN = b"GET /objects/ds/small.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-99\r\n\r\n"
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.asynccontextmanager
async def _spoke_with_readers(
    hub: RunningServer, tmp_path: Path, *flags: str
) -> AsyncIterator[int]:
    """A ``--workers 2`` spoke (a subprocess, and its reader) run with ``flags``; its port."""
    spoke: Process = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "2", "--access-log", "off", "--log-level", "warning", *flags,
    ])
    try:
        yield int(spoke.url.rsplit(":", 1)[1])
    finally:
        await asyncio.to_thread(spoke.stop)


def _process_of(head: bytes) -> bytes:
    return head.split(b"X-Request-Id: ")[1][:8]  # request ids start with a per-process prefix


async def test_each_process_of_a_spoke_with_readers_closes_its_idlest_connection(
    hub: RunningServer, tmp_path: Path
) -> None:
    by_process: dict[bytes, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]]] = {}
    async with _spoke_with_readers(hub, tmp_path, "--max-connections-per-client", str(CAP)) \
            as port:
        try:
            # Connections one after another, each left idle once answered, until both
            # processes have had more than their cap's worth: every one is answered.
            for _ in range(200):
                conn = await _kept_alive(port, PLAIN)
                by_process.setdefault(_process_of(conn[2]), []).append(conn)
                if len(by_process) == 2 and min(map(len, by_process.values())) > CAP:
                    break
            assert len(by_process) == 2 and min(map(len, by_process.values())) > CAP
            for process, conns in by_process.items():
                for reader, _, _ in conns[:-CAP]:  # the idlest made room, in order
                    assert await _closed_after(reader, WAIT_S) is not None
                for reader, writer, _ in conns[-CAP:]:  # the newest are served as before
                    writer.write(PLAIN)
                    assert _process_of(await _read_response(reader)) == process
        finally:
            for conns in by_process.values():
                for _, writer, _ in conns:
                    writer.close()


Opened = tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]


async def _closed_on_both_processes(
    port: int, open_one: Callable[[int, bool], Awaitable[Opened]]
) -> None:
    """Connections from ``open_one(port, plain)``, alternately with a plain read (either
    process answers) and without (a reader hands the connection over to the owner), are
    each closed by the server; until at least four were, and plain reads met both
    processes of the spoke."""
    seen: set[bytes] = set()
    for i in range(200):
        plain = i % 2 == 0
        reader, writer, head = await open_one(port, plain)
        try:
            assert await _closed_after(reader, WAIT_S) is not None
        finally:
            writer.close()
        if plain:
            seen.add(_process_of(head))
        if len(seen) == 2 and i >= 3:
            return
    raise AssertionError(f"only {seen} answered")


async def test_a_slow_header_on_a_kept_alive_connection_of_either_process_is_cut(
    hub: RunningServer, tmp_path: Path
) -> None:
    warm = b"POST /warm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
        b"Content-Length: 2\r\n\r\n[]"  # a reader hands it, and what follows, over

    async def slow_header(port: int, plain: bool) -> Opened:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PLAIN if plain else warm + PARTIAL)
        head = await _read_response(reader)
        if plain:
            writer.write(PARTIAL)
        return reader, writer, head

    async with _spoke_with_readers(hub, tmp_path, "--header-timeout", "0.5") as port:
        await _closed_on_both_processes(port, slow_header)


async def test_idle_connections_of_either_process_time_out(
    hub: RunningServer, tmp_path: Path
) -> None:
    async def idle(port: int, plain: bool) -> Opened:
        return await _kept_alive(port, PLAIN if plain else HEALTH)

    async with _spoke_with_readers(hub, tmp_path, "--keepalive-timeout", "0.5") as port:
        await _closed_on_both_processes(port, idle)
