"""The per-client cap on requests in flight, on a real hub held behind a gate."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from hub.config import HubConfig
from service.limits import CONNECTIONS, LIMIT, ConnectionLimits, InflightLimit
from tests.conftest import CHUNK, SpokeFactory
from tests.security.conftest import Dataset, call, problem
from tests.support.servers import GatedBackend, RunningServer, start_hub


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
        assert spoke.app[CONNECTIONS].header_timeouts == 0
    finally:
        writer.close()


async def test_connections_over_the_per_client_cap_are_closed_and_counted(
    dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_connections_per_client=3)
    )
    port = _port(hub)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.05)  # the server has accepted them
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for reader, writer in extra:
            with contextlib.suppress(ConnectionError):
                writer.write(GET_SMALL)
            assert await _closed_after(reader, 2.0) is not None  # closed, nothing answered
            writer.close()
        limits = hub.app[CONNECTIONS]
        assert limits.refused == 2
        for reader, writer in held:  # the first three are served as usual
            writer.write(GET_SMALL)
            assert b" 200 " in await _read_response(reader)
        for _, writer in held:
            writer.close()
        held = []
        for _ in range(100):  # the server sees them go
            if not limits.series("x")[1].read():
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


def test_connection_slots_are_per_client_and_given_back() -> None:
    limits = ConnectionLimits(max_per_client=2, header_timeout_s=0)
    assert limits.open("a") and limits.open("a") and not limits.open("a")
    assert limits.open("b")
    limits.close("a")
    assert limits.open("a")
    for client in ("a", "a", "b"):
        limits.close(client)
    assert limits.refused == 1 and limits.series("x")[1].read() == 0


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
    assert (hub.max_connections_per_client, hub.header_timeout_s) == (256, 10.0)
    _, hub = parse_config(["serve", "--root", "/r", "--max-connections-per-client", "7",
                           "--header-timeout", "2.5"], {"HUBSPOKE_HEADER_TIMEOUT": "9"})
    assert (hub.max_connections_per_client, hub.header_timeout_s) == (7, 2.5)
    spoke = config_from_args(parse_args(
        ["serve", "--hub", "http://h", "--cache-dir", "/c", "--capacity", "1GiB"],
        {"HUBSPOKE_MAX_CONNECTIONS_PER_CLIENT": "9", "HUBSPOKE_HEADER_TIMEOUT": "0.5"}))
    assert (spoke.max_connections_per_client, spoke.header_timeout_s) == (9, 0.5)


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
