"""A chunk fill answered on the hub's store fast path (:mod:`hub.store.fills`) whose
client hangs up the moment it has it is logged and counted once, like any other; one
whose client leaves mid-body, or (from a store reached by TLS) while it still waits for
a store thread, lets go of every descriptor it held.

As in :mod:`tests.integration.test_hangups`, the hub runs on uvloop and its loop is held
up while the answer goes and the client (a process of its own) reads and closes, so
that the close reaches the loop before the fill's coroutine resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import uvloop

from hub.store import s3
from loadtest.s3_stores import S3Store
from tests.hub_s3.conftest import Bucket, NotedHub, noted_store_hub
from tests.support.hangups import (
    HUGE,
    HUGE_BYTES,
    ROUNDS,
    WAIT_S,
    AccessLines,
    changed,
    count_once_back,
    hang_up_after_reading,
    huge,
    logged,
    metrics,
    open_fds,
    open_sockets,
    stalled_client,
)
from tests.support.raw_http import connect, read_response, request

BIG = "ds/big.bin"  # 40 chunks and 7 bytes: a fill of all of it is spliced off the socket
STORE_THREADS = 2  # the test hub's turns at the store: few, so that a fill can wait for one


def test_a_store_fill_its_client_hung_up_on_at_once_is_logged_and_counted(
    bucket: Bucket, store: S3Store, access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(fills_hung_up_on(bucket, store, access_log, tmp_path))


async def fills_hung_up_on(
    bucket: Bucket, store: S3Store, access_log: AccessLines, tmp_path: Path,
) -> None:
    size = len(bucket.contents[BIG])
    target = f"/objects/{BIG}"
    async with noted_store_hub(store.url, store, tmp_path) as hub, aiohttp.ClientSession() as http:
        before, since = await metrics(http, hub.url), len(access_log())
        await hub.took()
        read = await hang_up_after_reading(hub.url, target, f"bytes=0-{size - 1}", tmp_path)
        assert read == [(206, size)] * ROUNDS
        assert await logged(access_log, target, since) == [(206, size)] * ROUNDS
        assert await hub.took() == [True] * ROUNDS  # every fill on the fast path
        after = await metrics(http, hub.url)
    # Every fill, and the first /metrics request (counted as it came in).
    assert changed(before, after, "hub_requests_total", "hub_bytes_sent_total",
                   "hub_client_hangups_total") == [ROUNDS + 1, ROUNDS * size, 0]


async def test_a_fill_its_client_leaves_mid_body_lets_go_of_every_descriptor(
    bucket: Bucket, store: S3Store, tmp_path: Path,
) -> None:
    huge(bucket.root)
    target = f"/objects/{HUGE}"
    async with noted_store_hub(store.url, store, tmp_path) as hub:
        # A first fill signs the URL and leaves one store connection kept alive; its own
        # connection stays open, so that nothing but the next fill opens or closes.
        reader, writer = await connect(hub.url)
        writer.write(request(target, "Range: bytes=0-9"))
        assert (await read_response(reader))[2] == bytes(10)
        assert await hub.took() == [True]
        before = open_fds()
        # A fill of all of it, its head read and its body not: the loop waits on the
        # client's full socket, holding the kept store connection and a pipe.
        _, stalled = await stalled_client(hub.url, target, f"Range: bytes=0-{HUGE_BYTES - 1}")
        stalled.close()
        await stalled.wait_closed()
        # Its socket's copy and the pipe closed; so is the store connection, cut
        # mid-body: never kept for another GET, which would read its rest as a head.
        assert await count_once_back(open_fds, before - 1) == before - 1
        writer.write(request(target, "Range: bytes=1000-1999"))
        assert (await read_response(reader))[2] == bytes(1000)
        assert (await hub.took())[-1] is True
        writer.close()


@pytest.mark.parametrize("store_kind", ["store", "tls_store"])
async def test_a_fill_waiting_for_its_turn_at_the_store_lets_go_of_its_socket_on_a_hang_up(
    store_kind: str, bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # Fills from a store over plain HTTP wait for a turn of the loop's GETs; from one
    # reached by TLS, for a store thread (hub.store.fills). As many of either.
    huge(bucket.root)
    monkeypatch.setattr(s3, "STORE_CONNECTIONS", STORE_THREADS)
    store: S3Store = request.getfixturevalue(store_kind)
    target = f"/objects/{HUGE}"
    fill = "Range: bytes=0-" + str((48 << 20) - 1)
    stalled = []
    async with noted_store_hub(store.url, store, tmp_path) as hub:
        try:
            # Every turn taken by a client that does not read.
            for _ in range(STORE_THREADS):
                stalled.append(await stalled_client(hub.url, target, fill))
            before = open_sockets()
            _, writer = await connect_and_send(hub.url, target, fill)
            await wait_until_asked(hub, STORE_THREADS + 1)  # its fill waits for a turn
            writer.close()
            await writer.wait_closed()
            now = await count_once_back(open_sockets, before)
            # Its socket, and the copy of it that its fill would have closed.
            assert now == before
        finally:
            for _, w in stalled:
                w.close()


async def connect_and_send(
    url: str, target: str, *fields: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write("\r\n".join([f"GET {target} HTTP/1.1", "Host: x", *fields, "", ""]).encode())
    await writer.drain()
    return reader, writer


async def wait_until_asked(hub: NotedHub, requests: int) -> None:
    """Until the hub's fast handler has been given ``requests`` requests (bounded)."""
    async with asyncio.timeout(WAIT_S):
        while hub.asked < requests:  # noqa: ASYNC110 (a count the wrapper keeps, no event)
            await asyncio.sleep(0.02)
