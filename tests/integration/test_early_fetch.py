"""An unknown object's first chunk is asked of the hub alongside its manifest.

The hub's reads are held behind ``gated.gate``; its manifest hashing reads through the
gate too. With the gate shut, a cold read of an object the spoke knows nothing of must
put two reads on the hub at once (the manifest's and the chunk's): asked one after
the other, the chunk would wait for the manifest, which waits for the gate.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp

from hub.app import make_app as make_hub_app
from hub.config import HubConfig
from service.runner import start_site
from spoke.config import SpokeConfig
from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import GatedBackend, RunningServer, start_spoke
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
WAIT_S = 10.0


async def read(
    http: aiohttp.ClientSession, spoke: RunningServer, path: str, first: int | None = None,
    last: int | None = None, method: str = "GET", headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    fields = dict(headers or {})
    if first is not None:
        fields["Range"] = f"bytes={first}-{'' if last is None else last}"
    async with http.request(method, f"{spoke.url}/objects/{path}", headers=fields) as resp:
        return resp.status, await resp.read()


async def counts(http: aiohttp.ClientSession, spoke: RunningServer) -> dict[str, Any]:
    return await settled_stats(http, spoke.url)


def grew(before: dict[str, Any], after: dict[str, Any], *keys: str) -> tuple[int, ...]:
    return tuple(after[k] - before[k] for k in keys)


async def learn_chunk_size(http: aiohttp.ClientSession, spoke: RunningServer) -> None:
    """Wait until the spoke knows the hub's chunk size (it asks the hub's /healthz at
    start, in the background)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if (await counts(http, spoke))["hub_chunk_size"] == CHUNK:
                return
            await asyncio.sleep(0.01)


async def test_a_fresh_spoke_fetches_its_very_first_read_early(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_spoke()
    # No manifest seen yet: the chunk size comes from the hub's /healthz.
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    assert before["manifest_fetches"] == 0
    data = dataset[1]["ds/big.bin"]
    assert await read(http, spoke, "ds/big.bin", 10, 109) == (206, data[10:110])
    after = await counts(http, spoke)
    assert grew(before, after, "early_fetches", "early_fetches_used", "manifest_fetches") == (
        1, 1, 1)
    assert grew(before, after, "hub_fetches")[0] == 1 + grew(
        before, after, "prefetched_chunks")[0]


async def test_a_spoke_that_cannot_reach_the_hub_at_start_learns_the_size_later(
    dataset: Dataset, tmp_path: Path, http: aiohttp.ClientSession,
) -> None:
    with socket.socket() as reserved:  # the hub's address, with nobody listening yet
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
    spoke = await start_spoke(SpokeConfig(
        hub_url=f"http://127.0.0.1:{port}", cache_dir=str(tmp_path / "cache"),
        capacity_bytes=64 << 20, meta_ttl_s=5.0))
    hub_runner = None
    try:
        # Its question at start is refused; it serves on, not knowing the chunk size.
        sizing = spoke.app[CACHE]._sizing
        assert sizing is not None
        await asyncio.wait_for(asyncio.shield(sizing), WAIT_S)
        assert (await counts(http, spoke))["hub_chunk_size"] is None
        hub_runner, _ = await start_site(
            make_hub_app(HubConfig(root=str(dataset[0]), chunk_size=CHUNK)), "127.0.0.1", port)
        before = await counts(http, spoke)
        assert await read(http, spoke, "ds/small.bin") == (200, dataset[1]["ds/small.bin"])
        # No size, no guess: the first object waited for its manifest ...
        assert grew(before, await counts(http, spoke), "early_fetches")[0] == 0
        await learn_chunk_size(http, spoke)  # ... which told the size,
        before = await counts(http, spoke)
        assert (await read(http, spoke, "ds/big.bin", 0, 99))[0] == 206
        # ... so the next new object's first chunk is asked for with its manifest.
        assert grew(before, await counts(http, spoke), "early_fetches_used")[0] == 1
    finally:
        await spoke.stop()
        if hub_runner is not None:
            await hub_runner.cleanup()


async def test_the_first_chunk_and_the_manifest_are_asked_for_at_once(
    hub: RunningServer, spoke: RunningServer, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    data = dataset[1]["ds/big.bin"]
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    gated.drain()
    gated.gate.clear()
    try:
        answer = asyncio.create_task(read(http, spoke, "ds/big.bin", CHUNK + 10, CHUNK + 109))
        for what in ("the manifest's hashing", "the first chunk"):
            held = await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
            assert held, f"{what} never reached the hub while the gate was shut"
    finally:
        gated.gate.set()
    assert await answer == (206, data[CHUNK + 10:CHUNK + 110])
    after = await counts(http, spoke)
    early, used, fetches, prefetched = grew(
        before, after, "early_fetches", "early_fetches_used", "hub_fetches", "prefetched_chunks")
    assert (early, used) == (1, 1)
    assert fetches == 1 + prefetched  # the early fetch was the chunk's only one


async def test_an_object_ending_inside_the_chunk_comes_whole_from_the_early_fetch(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    assert await read(http, spoke, "other/notes.csv") == (200, dataset[1]["other/notes.csv"])
    tail = CHUNK * 5  # ds/partial.bin's last chunk is 123 bytes
    assert await read(http, spoke, "ds/partial.bin", tail + 3) == (
        206, dataset[1]["ds/partial.bin"][tail + 3:])
    after = await counts(http, spoke)
    assert grew(before, after, "early_fetches", "early_fetches_used") == (2, 2)
    assert grew(before, after, "hub_fetches")[0] == 2 + grew(
        before, after, "prefetched_chunks")[0]
    # Stored like any fetched chunk: read again, it is a hit.
    again = await counts(http, spoke)
    assert await read(http, spoke, "other/notes.csv") == (200, dataset[1]["other/notes.csv"])
    assert grew(again, await counts(http, spoke), "hits", "hub_fetches") == (1, 0)


async def test_nothing_is_fetched_early_for_an_object_with_chunks_on_disk(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    first = await make_spoke()
    await learn_chunk_size(http, first)
    assert (await read(http, first, "ds/big.bin", 0, 99))[0] == 206
    await counts(http, first)  # stored
    await first.stop()
    again = await make_spoke()  # same cache directory, nothing in memory
    await learn_chunk_size(http, again)
    before = await counts(http, again)
    assert await read(http, again, "ds/big.bin", 0, 99) == (206, dataset[1]["ds/big.bin"][:100])
    after = await counts(http, again)
    # A chunk already held would make the early fetch a waste of the link.
    assert grew(before, after, "early_fetches", "hub_fetches") == (0, 0)


async def test_reads_that_may_carry_no_bytes_fetch_nothing_early(
    spoke: RunningServer, http: aiohttp.ClientSession,
) -> None:
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    assert (await read(http, spoke, "ds/big.bin", method="HEAD"))[0] == 200
    status, _ = await read(http, spoke, "ds/exact.bin", headers={"If-None-Match": '"x"'})
    assert status == 200
    suffix_status, _ = await read(http, spoke, "ds/partial.bin", headers={"Range": "bytes=-10"})
    assert suffix_status == 206
    assert grew(before, await counts(http, spoke), "early_fetches")[0] == 0


async def test_an_early_fetch_of_a_missing_object_changes_nothing_but_a_request(
    spoke: RunningServer, http: aiohttp.ClientSession,
) -> None:
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    status, body = await read(http, spoke, "ds/missing.bin")
    assert status == 404 and b"not found" in body.lower()
    after = await counts(http, spoke)
    # The guess went out (a chunk request, counted as one) and is of no use.
    assert grew(before, after, "early_fetches", "early_fetches_used", "hub_fetches") == (1, 0, 1)
    assert grew(before, after, "hub_bytes", "cached_chunks") == (0, 0)


async def test_no_early_fetch_while_the_hub_is_failing(
    hub: RunningServer, make_spoke: SpokeFactory, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_spoke(breaker_threshold=1, breaker_reset_s=60.0)
    await learn_chunk_size(http, spoke)
    before = await counts(http, spoke)
    await hub.stop()
    for path in ("ds/small.bin", "ds/exact.bin"):
        assert (await read(http, spoke, path))[0] == 503
    after = await counts(http, spoke)
    assert after["breaker_state"] == "open"
    # The first read's early fetch went out while the breaker was still closed; once it
    # is open, no read asks the hub for anything on a guess.
    assert grew(before, after, "early_fetches", "early_fetches_used") == (1, 0)


async def test_an_early_fetch_taken_on_keeps_no_chunk_memory_after_its_read(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
    monkeypatch: Any,
) -> None:
    """The timer that drops an early fetch nobody took must not hold one a flight took:
    its chunk buffer would outlive the read (under faults, by dozens at once)."""
    monkeypatch.setattr("spoke.cache.early.KEPT_S", 3600.0)
    spoke = await make_spoke(readahead_chunks=0, sequential_readahead_chunks=0)
    await learn_chunk_size(http, spoke)
    data = dataset[1]["ds/big.bin"]
    assert await read(http, spoke, "ds/big.bin", 10, 109) == (206, data[10:110])
    assert (await counts(http, spoke))["early_fetches_used"] == 1
    async with asyncio.timeout(WAIT_S):
        while True:
            if (await counts(http, spoke))["fill_buffer_bytes"] == 0:
                return
            await asyncio.sleep(0.01)
