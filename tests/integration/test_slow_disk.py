"""A slow disk: answers end when their bytes are verified, not when they are stored.

The spoke's chunk store is held (its ``write`` waits on an event, as a disk busy
with other work would), everything else is real: hub, spoke, HTTP.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from spoke.cache.store import ChunkStore
from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK, SpokeFactory
from tests.support.cache_dir import chunk_files
from tests.support.http import stats
from tests.support.servers import RunningServer
from tests.support.waits import settled_stats, wait_for_stats

Dataset = tuple[Path, dict[str, bytes]]
BIG = "ds/big.bin"
WAIT_S = 10.0


class HeldDisk:
    """Chunk writes wait until :meth:`release`."""

    def __init__(self, store: ChunkStore) -> None:
        self.gate = threading.Event()
        self._write = store.write
        store.write = self.write  # type: ignore[method-assign]

    def write(self, name: str, data: bytes | bytearray | memoryview) -> os.stat_result:
        assert self.gate.wait(WAIT_S), "the test never released the disk"
        return self._write(name, data)

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
async def held_spoke(make_spoke: SpokeFactory) -> AsyncIterator[tuple[RunningServer, HeldDisk]]:
    spoke = await make_spoke(fetch_concurrency=2, readahead_chunks=0, sequential_readahead_chunks=0)
    disk = HeldDisk(spoke.app[CACHE].store)
    try:
        yield spoke, disk
    finally:
        disk.release()  # never leave an executor thread waiting


async def get_chunk(
    http: aiohttp.ClientSession, spoke: RunningServer, index: int
) -> tuple[int, str, bytes]:
    headers = {"Range": f"bytes={index * CHUNK}-{(index + 1) * CHUNK - 1}"}
    async with http.get(f"{spoke.url}/objects/{BIG}", headers=headers) as resp:
        return resp.status, resp.headers["X-Cache"], await resp.read()


async def test_an_answer_ends_before_its_chunk_is_stored_and_a_reread_is_a_memory_hit(
    held_spoke: tuple[RunningServer, HeldDisk], dataset: Dataset, http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    spoke, disk = held_spoke
    data = dataset[1][BIG]
    # The disk is held, yet the cold answer ends (it would hang with a store-bound end).
    status, x_cache, body = await asyncio.wait_for(get_chunk(http, spoke, 2), WAIT_S)
    assert (status, x_cache, body) == (206, "MISS", data[2 * CHUNK : 3 * CHUNK])
    doc = await stats(http, spoke.url)
    assert (doc["chunks_storing"], doc["cached_chunks"]) == (1, 0)
    assert len(chunk_files(tmp_path / "cache")) == 0

    # Read again while it is being stored: from memory, no second hub fetch.
    status, x_cache, body = await asyncio.wait_for(get_chunk(http, spoke, 2), WAIT_S)
    assert (status, x_cache, body) == (206, "HIT", data[2 * CHUNK : 3 * CHUNK])
    doc = await stats(http, spoke.url)
    assert (doc["hub_fetches"], doc["hits"], doc["misses"]) == (1, 1, 1)
    assert doc["bytes_served_hit"] == CHUNK
    cache = spoke.app[CACHE]
    manifest, _ = await cache.manifest(BIG)
    chunk = await asyncio.wait_for(cache.get(manifest, 2), WAIT_S)  # not waiting on the disk
    assert (chunk.hit, chunk.data) == (True, data[2 * CHUNK : 3 * CHUNK])

    disk.release()
    doc = await settled_stats(http, spoke.url)
    assert (doc["cached_chunks"], doc["used_bytes"], doc["hub_fetches"]) == (1, CHUNK, 1)
    assert doc["hits"] == 2
    assert len(chunk_files(tmp_path / "cache")) == 1
    status, x_cache, body = await get_chunk(http, spoke, 2)
    assert (status, x_cache, body) == (206, "HIT", data[2 * CHUNK : 3 * CHUNK])


async def test_fetches_wait_while_the_disk_holds_as_many_chunks_as_can_be_fetched(
    held_spoke: tuple[RunningServer, HeldDisk], dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    spoke, disk = held_spoke
    data = dataset[1][BIG]
    # fetch_concurrency=2: two verified chunks may wait for the disk, no more.
    for index in (0, 1):
        assert (await get_chunk(http, spoke, index))[1] == "MISS"
    third = asyncio.create_task(get_chunk(http, spoke, 5))
    await wait_for_stats(http, spoke.url, lambda doc: doc["misses"] == 3)  # the third read is in
    await asyncio.sleep(0.2)  # room for a fetch that should not start
    doc = await stats(http, spoke.url)
    assert not third.done()
    assert (doc["chunks_storing"], doc["hub_fetches"], doc["misses"]) == (2, 2, 3)

    disk.release()
    status, x_cache, body = await asyncio.wait_for(third, WAIT_S)
    assert (status, x_cache, body) == (206, "MISS", data[5 * CHUNK : 6 * CHUNK])
    doc = await settled_stats(http, spoke.url)
    assert (doc["cached_chunks"], doc["hub_fetches"]) == (3, 3)


async def test_a_purge_takes_chunks_still_being_stored_and_none_land_after_it(
    held_spoke: tuple[RunningServer, HeldDisk], http: aiohttp.ClientSession, tmp_path: Path,
) -> None:
    spoke, disk = held_spoke
    assert (await get_chunk(http, spoke, 3))[1] == "MISS"
    assert (await stats(http, spoke.url))["chunks_storing"] == 1

    async def purge() -> int:
        async with http.delete(f"{spoke.url}/cache/{BIG}") as resp:
            assert resp.status == 200
            purged: int = (await resp.json())["purged_chunks"]
            return purged

    purging = asyncio.create_task(purge())
    await asyncio.sleep(0.2)
    assert not purging.done()  # the served chunk lands first, then goes with the rest
    disk.release()
    assert await asyncio.wait_for(purging, WAIT_S) == 1
    doc = await settled_stats(http, spoke.url)
    assert (doc["cached_chunks"], doc["used_bytes"], doc["purged_chunks"]) == (0, 0, 1)
    assert len(chunk_files(tmp_path / "cache")) == 0
    assert (await get_chunk(http, spoke, 3))[1] == "MISS"
