"""Single-flight on the spoke: concurrent cold readers of one chunk cost one hub fetch.

The hub's reads are held behind ``gated.gate`` (groupcache's ``TestGetDupSuppress``
style): readers line up, the test checks that exactly one read reached the hub,
then opens the gate and counts fills on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from hub.config import HubConfig
from hub.handlers import READ_BLOCK_BYTES
from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK
from tests.support.backoff import HeldBackoff
from tests.support.http import Response, fetch, metric
from tests.support.raw_http import raw_get
from tests.support.servers import (
    GatedBackend,
    RunningServer,
    start_hub,
    write_dataset,
)
from tests.support.waits import settled_stats, wait_for_stats

Dataset = tuple[Path, dict[str, bytes]]
WAIT_S = 10.0


async def warm_manifest(http: aiohttp.ClientSession, spoke_url: str, path: str) -> None:
    """Have the hub hash ``path`` and the spoke cache its manifest, with the gate open.

    The hub's manifest hashing reads through the gated backend too, so it must
    happen before the gate closes (``held`` then drains the semaphore of those reads).
    """
    async with http.head(f"{spoke_url}/objects/{path}") as resp:
        assert resp.status == 200


async def hub_holds_a_read(gated: GatedBackend) -> None:
    assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S), "no read reached the hub"


async def held(gated: GatedBackend, line_up: Callable[[], Awaitable[None]]) -> None:
    """Close the gate, run ``line_up`` (which starts readers and waits for them), open it."""
    gated.drain()
    gated.gate.clear()
    try:
        await line_up()
    finally:
        gated.gate.set()


async def test_32_cold_readers_of_one_chunk_cost_one_hub_fetch(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    await warm_manifest(http, spoke.url, path)
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    start, stop = 3 * CHUNK + 100, 3 * CHUNK + 5000  # inside chunk 3
    url = f"{spoke.url}/objects/{path}"
    tasks: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        tasks.extend(
            asyncio.create_task(fetch(http, url, {"Range": f"bytes={start}-{stop - 1}"}))
            for _ in range(32)
        )
        await hub_holds_a_read(gated)
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 32)
        # Every reader is parked on the one fetch: no second read reached the hub.
        assert not gated.waiting.acquire(blocking=False)
        assert not any(t.done() for t in tasks)

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)

    for status, headers, body in results:
        assert status == 206
        assert headers["Content-Range"] == f"bytes {start}-{stop - 1}/{len(data)}"
        assert headers["X-Cache"] == "MISS"
        assert body == data[start:stop]
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == CHUNK
    stats = await settled_stats(http, spoke.url)
    assert (stats["hub_fetches"], stats["singleflight_joins"]) == (1, 31)
    assert (stats["misses"], stats["hits"], stats["hub_bytes"]) == (32, 0, CHUNK)
    assert stats["used_bytes"] == CHUNK

    # The filled chunk is now a plain hit.
    status, headers, body = await fetch(http, url, {"Range": f"bytes={start}-{stop - 1}"})
    assert (status, headers["X-Cache"], body) == (206, "HIT", data[start:stop])
    stats = await settled_stats(http, spoke.url)
    assert (stats["hits"], stats["hub_fetches"]) == (1, 1)


async def test_8_readers_of_a_multi_chunk_range_fetch_each_chunk_once(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    await warm_manifest(http, spoke.url, path)
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    start, stop = 10 * CHUNK + 17, 15 * CHUNK - 5  # touches chunks 10..14, partly 10 and 14
    url = f"{spoke.url}/objects/{path}"
    tasks: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        tasks.extend(
            asyncio.create_task(fetch(http, url, {"Range": f"bytes={start}-{stop - 1}"}))
            for _ in range(8)
        )
        await hub_holds_a_read(gated)
        # Each reader resolves the range's first chunk before sending headers.
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 8)

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)

    for status, headers, body in results:
        assert (status, headers["X-Cache"]) == (206, "MISS")
        assert body == data[start:stop]
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == 5 * CHUNK
    stats = await settled_stats(http, spoke.url)
    assert stats["hub_fetches"] == 5
    assert stats["hub_bytes"] == 5 * CHUNK
    assert stats["hits"] + stats["misses"] == 8 * 5
    assert stats["misses"] - stats["singleflight_joins"] == 5
    assert stats["used_bytes"] == 5 * CHUNK


async def test_a_failed_fetch_fails_every_waiter_cleanly_and_poisons_nothing(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    path, data = "ds/partial.bin", dataset[1]["ds/partial.bin"]
    await warm_manifest(http, spoke.url, path)
    url = f"{spoke.url}/objects/{path}"
    rng = {"Range": f"bytes={CHUNK}-{2 * CHUNK - 1}"}  # chunk 1
    tasks: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        gated.fail_reads = True
        tasks.extend(asyncio.create_task(fetch(http, url, rng)) for _ in range(6))
        await hub_holds_a_read(gated)
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 6)

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)  # no hang

    for status, headers, body in results:
        assert status in (502, 503)
        assert headers["Content-Type"].startswith("application/problem+json")
        problem = json.loads(body)
        assert problem["status"] == status
        assert problem["title"] and problem["detail"]
    stats = await settled_stats(http, spoke.url)
    # One flight for all six: its attempts (retries included) are the only hub fetches.
    assert (stats["misses"], stats["fill_failures"]) == (6, 1)
    assert stats["hub_fetches"] == 1 + stats["hub_retries"]
    fetches = stats["hub_fetches"]
    assert (stats["used_bytes"], stats["cached_chunks"]) == (0, 0)

    # No poisoned entry: the next reader starts a fresh fetch, which is then cached.
    gated.fail_reads = False
    for expected in ("MISS", "HIT"):
        status, headers, body = await fetch(http, url, rng)
        assert (status, headers["X-Cache"]) == (206, expected)
        assert body == data[CHUNK : 2 * CHUNK]
    stats = await settled_stats(http, spoke.url)
    assert (stats["hub_fetches"], stats["hits"], stats["used_bytes"]) == (fetches + 1, 1, CHUNK)


async def test_a_reader_hanging_up_does_not_cancel_the_fetch_others_wait_on(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    path, data = "ds/partial.bin", dataset[1]["ds/partial.bin"]
    await warm_manifest(http, spoke.url, path)
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    url = f"{spoke.url}/objects/{path}"
    rng = {"Range": f"bytes={2 * CHUNK}-{3 * CHUNK - 1}"}  # chunk 2
    first: list[asyncio.Task[Response]] = []
    others: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        first.append(asyncio.create_task(fetch(http, url, rng)))  # starts the flight
        await hub_holds_a_read(gated)
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 1)
        others.extend(asyncio.create_task(fetch(http, url, rng)) for _ in range(3))
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 4)
        first[0].cancel()  # the flight's starter hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await first[0]
        await asyncio.sleep(0.05)  # let the spoke see the closed connection

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*others), WAIT_S)

    for status, headers, body in results:
        assert (status, headers["X-Cache"]) == (206, "MISS")
        assert body == data[2 * CHUNK : 3 * CHUNK]
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == CHUNK
    stats = await wait_for_stats(http, spoke.url, lambda s: s["used_bytes"] == CHUNK)
    assert (stats["hub_fetches"], stats["fill_failures"]) == (1, 0)
    status, headers, _ = await fetch(http, url, rng)
    assert (status, headers["X-Cache"]) == (206, "HIT")


async def test_cancelling_the_task_that_started_a_flight_leaves_it_running(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    """The same, one level down: aiohttp does not cancel handlers on hang-up by default,
    so cancel the starting ``ChunkCache.get`` itself."""
    data = dataset[1]["ds/exact.bin"]
    cache = spoke.app[CACHE]
    manifest, stale = await cache.manifest("ds/exact.bin")
    assert not stale
    starter: list[asyncio.Task[Any]] = []
    joiners: list[asyncio.Task[Any]] = []

    async def line_up() -> None:
        starter.append(asyncio.create_task(cache.get(manifest, 3)))
        await hub_holds_a_read(gated)
        joiners.extend(asyncio.create_task(cache.get(manifest, 3)) for _ in range(3))
        for _ in range(1000):  # the joiners reach the flight within a few loop turns
            if cache.stats.misses == 4:
                break
            await asyncio.sleep(0.005)
        assert cache.stats.misses == 4
        starter[0].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starter[0]
        assert starter[0].cancelled()

    await held(gated, line_up)
    chunks = await asyncio.wait_for(asyncio.gather(*joiners), WAIT_S)

    assert [c.data for c in chunks] == [data[3 * CHUNK :]] * 3
    assert cache.is_cached(manifest, 3)
    assert (cache.stats.hub_fetches, cache.stats.misses, cache.used_bytes) == (1, 4, CHUNK)
    assert cache.stats.singleflight_joins == 3


async def test_waiters_of_a_failed_flight_count_as_singleflight_joins(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, http: aiohttp.ClientSession,
) -> None:
    path = "ds/exact.bin"
    await warm_manifest(http, spoke.url, path)
    url = f"{spoke.url}/objects/{path}"
    tasks: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        gated.fail_reads = True
        tasks.extend(
            asyncio.create_task(fetch(http, url, {"Range": "bytes=0-99"})) for _ in range(4)
        )
        await hub_holds_a_read(gated)
        await wait_for_stats(http, spoke.url, lambda s: s["misses"] == 4)

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)

    assert [status for status, _, _ in results] == [503] * 4
    stats = await settled_stats(http, spoke.url)
    assert (stats["misses"], stats["fill_failures"]) == (4, 1)
    # Three requests waited on the fetch the first one started.
    assert stats["singleflight_joins"] == 3


WIDE = 2 << 20  # a hub chunk the hub streams in two blocks of READ_BLOCK_BYTES


async def test_a_reader_joining_during_a_retrys_backoff_gets_the_retrys_bytes(
    make_spoke: Callable[..., Awaitable[RunningServer]], dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    # Reader A asks for a sample (sent only verified), so the first attempt's bytes
    # are nobody's when it breaks, and it is retried. Reader B asks for the whole
    # chunk during the backoff: it must wait for the retry's bytes, not stream the
    # broken attempt's (after which the retry could not start over: A and B cut).
    root = dataset[0]
    data = write_dataset(str(root), {"wide/w.bin": WIDE + 100}, seed=25)["wide/w.bin"]
    backend = GatedBackend(str(root))  # no fileno: the hub streams block by block
    wide_hub = await start_hub(HubConfig(root=str(root), chunk_size=WIDE), backend)
    try:
        spoke = await make_spoke(hub_url=wide_hub.url, meta_ttl_s=60.0)
        await warm_manifest(http, spoke.url, "wide/w.bin")
        # The hub sends the head and 1 MiB of chunk 0, then closes the connection.
        backend.cut_once_at = READ_BLOCK_BYTES
        backoff = HeldBackoff()
        spoke.app[CACHE].calls.sleep = backoff.sleep
        target = "/objects/wide/w.bin"
        sample = asyncio.create_task(raw_get(spoke.url, target, "Range: bytes=0-99"))
        await asyncio.wait_for(backoff.entered.wait(), WAIT_S)
        whole = asyncio.create_task(raw_get(spoke.url, target, f"Range: bytes=0-{WIDE - 1}"))
        await wait_for_stats(http, spoke.url, lambda s: s["singleflight_joins"] == 1)
        backoff.release.set()
        a, b = await asyncio.wait_for(asyncio.gather(sample, whole), WAIT_S)
    finally:
        await wide_hub.stop()
    assert (a.status, a.complete, a.body) == (206, True, data[:100]), a.describe()
    assert (b.status, b.complete) == (206, True), b.describe()
    assert b.body == data[:WIDE]
    assert backend.cut_once_at is None and backoff.pauses == 1
    stats = await settled_stats(http, spoke.url)
    assert (stats["hub_fetches"], stats["fill_failures"]) == (2, 0)


async def test_misses_waiting_for_a_fetch_slot_hold_no_chunk_memory(
    make_spoke: Any, gated: GatedBackend, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    """Chunk memory follows the fetches running, not the misses waiting: under faults
    the misses can be hundreds, and each used to hold a chunk buffer from the start."""
    spoke = await make_spoke(fetch_concurrency=2, readahead_chunks=0,
                             sequential_readahead_chunks=0)
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    await warm_manifest(http, spoke.url, path)
    url = f"{spoke.url}/objects/{path}"
    chunks = range(1, 13)
    tasks: list[asyncio.Task[Response]] = []

    async def line_up() -> None:
        tasks.extend(
            asyncio.create_task(fetch(http, url, {"Range": f"bytes={start}-{start + 99}"}))
            for start in (i * CHUNK + 100 for i in chunks)
        )
        await hub_holds_a_read(gated)
        stats = await wait_for_stats(http, spoke.url, lambda s: s["misses"] == len(chunks))
        assert stats["fill_buffer_bytes"] <= 2 * CHUNK  # one per fetch slot at most

    await held(gated, line_up)
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    for i, (status, _, body) in zip(chunks, results, strict=True):
        assert status == 206 and body == data[i * CHUNK + 100 : i * CHUNK + 200]
    await settled_stats(http, spoke.url)
    # Every buffer is given back once its chunk is stored and its readers are done.
    await wait_for_stats(http, spoke.url, lambda s: s["fill_buffer_bytes"] == 0)
