"""The hub's fetches in a read plan's order: loader fetches waiting for a slot go in
the order the plan needs them (not the order they were asked in), and the plan's
prefetch takes every slot no loader waits for. Asserted on the order and number of
reads reaching the hub, which holds them at a gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from hub.backend import Backend, ObjectInfo, OpenObject
from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import GatedBackend, write_dataset
from tests.support.waits import wait_for_stats

PATH = "order/shard.bin"
SAMPLE = 1024
# Chunk indices in the order the plan reads them, one sample each.
PLAN = [3, 6, 1, 7, 0, 4, 2, 5]
WAIT_S = 10.0


class HubReads:
    """The hub's backend, noting which chunk of ``PATH`` each read is of, in order."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.chunks: list[int] = []

    def stat(self, path: str) -> ObjectInfo:
        return self.inner.stat(path)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def still_current(self, info: ObjectInfo) -> bool:
        return self.inner.still_current(info)

    def open(self, path: str) -> OpenObject:
        return _Noted(self, path, self.inner.open(path))


class _Noted:
    def __init__(self, reads: HubReads, path: str, inner: OpenObject) -> None:
        self._reads, self._path, self._inner = reads, path, inner
        self.info = inner.info

    def read(self, offset: int, length: int) -> bytes:
        if self._path == PATH and length:
            self._reads.chunks.append(offset // CHUNK)
        return self._inner.read(offset, length)

    def close(self) -> None:
        self._inner.close()


def noted(gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]]) -> tuple[HubReads, bytes]:
    """``PATH`` written, and the hub's reads behind the gate noted (in the order they pass
    it: one at a time when the spoke fetches one at a time)."""
    data = write_dataset(str(dataset[0]), {PATH: len(PLAN) * CHUNK}, seed=5)[PATH]
    reads = HubReads(gated.inner)
    gated.inner = reads  # type: ignore[assignment]
    return reads, data


async def post_plan(http: aiohttp.ClientSession, spoke: str) -> str:
    reads = [[PATH, chunk * CHUNK, SAMPLE] for chunk in PLAN]
    async with http.post(f"{spoke}/plans", json={"reads": reads}) as resp:
        assert resp.status == 201, await resp.text()
        plan_id: str = (await resp.json())["id"]
    return plan_id


async def read_chunk(http: aiohttp.ClientSession, spoke: str, plan: str, chunk: int) -> bytes:
    offset = chunk * CHUNK
    headers = {"Range": f"bytes={offset}-{offset + SAMPLE - 1}", "X-Hubspoke-Plan": plan}
    async with http.get(f"{spoke}/objects/{PATH}", headers=headers) as resp:
        assert resp.status == 206
        return await resp.read()


async def test_loader_fetches_waiting_for_a_slot_go_in_plan_order(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    reads, data = noted(gated, dataset)
    # One fetch at a time, and no read-ahead of our own: the hub's reads come one by
    # one, in the order the spoke hands out its one slot.
    spoke = await make_spoke(fetch_concurrency=1, readahead_chunks=0,
                             sequential_readahead_chunks=0)
    async with http.head(f"{spoke.url}/objects/{PATH}") as resp:  # the manifest, first
        assert resp.status == 200
    reads.chunks.clear()
    gated.gate.clear()
    try:
        plan = await post_plan(http, spoke.url)
        # The plan's prefetch holds the slot with its first chunk, at the gate.
        assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
        # Loaders then ask for the plan's next three chunks, the latest-needed first,
        # each waiting for the slot before the next asks.
        loaders = []
        for k, position in enumerate((3, 2, 1), start=1):
            loaders.append(asyncio.create_task(
                read_chunk(http, spoke.url, plan, PLAN[position])))
            await wait_for_stats(http, spoke.url, lambda d, k=k: d["misses"] >= k)
    finally:
        gated.gate.set()
    got = await asyncio.gather(*loaders)
    for position, answer in zip((3, 2, 1), got, strict=True):
        offset = PLAN[position] * CHUNK
        assert answer == data[offset:offset + SAMPLE]
    await wait_for_stats(http, spoke.url, lambda d: d["cached_chunks"] == len(PLAN))
    # In the plan's order (first come, first served would be 3, 7, 6, 1), then the
    # prefetch of the rest, in order too; each chunk fetched once.
    assert reads.chunks == PLAN


async def test_a_plans_prefetch_takes_every_slot_no_loader_waits_for(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    reads, data = noted(gated, dataset)
    spoke = await make_spoke(fetch_concurrency=4, readahead_chunks=0,
                             sequential_readahead_chunks=0)
    async with http.head(f"{spoke.url}/objects/{PATH}") as resp:
        assert resp.status == 200
    reads.chunks.clear()
    gated.gate.clear()
    try:
        plan = await post_plan(http, spoke.url)
        # All four slots, not only background work's half of them: a cold job's
        # first batches need most of its plan at once.
        for _ in range(4):
            assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
        doc = await wait_for_stats(http, spoke.url, lambda d: d["hub_fetches"] >= 4)
        assert doc["hub_fetches"] == 4
        # A loader's read of a chunk beyond them waits for the first free slot, ahead
        # of the prefetch of the one between.
        loader = asyncio.create_task(read_chunk(http, spoke.url, plan, PLAN[5]))
        await wait_for_stats(http, spoke.url, lambda d: d["misses"] >= 1)
    finally:
        gated.gate.set()
    offset = PLAN[5] * CHUNK
    assert await loader == data[offset:offset + SAMPLE]
    await wait_for_stats(http, spoke.url, lambda d: d["cached_chunks"] == len(PLAN))
    assert sorted(reads.chunks[:4]) == sorted(PLAN[:4])
    assert reads.chunks[4] == PLAN[5]
    assert sorted(reads.chunks) == sorted(PLAN)
