"""The hub's fetches in a read plan's order: loader fetches waiting for a slot go in
the order the plan needs them (not the order they were asked in), the plan's prefetch
takes every slot no loader waits for, and fetches the chunks an answer has not asked
for yet. Asserted on the order and number of reads reaching the hub, which holds them
at a gate."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from hub.backend import OpenObject
from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import GatedBackend, write_dataset
from tests.support.waits import POLL_S, wait_for_stats

PATH = "order/shard.bin"
SAMPLE = 1024
# Chunk indices in the order the plan reads them, one sample each.
PLAN = [3, 6, 1, 7, 0, 4, 2, 5]
WAIT_S = 10.0
# No read-ahead of the spoke's own, and the manifest trusted for the whole test (asked
# for again, it would cost the hub reads of its own, and an early fetch).
QUIET: dict[str, object] = {"readahead_chunks": 0, "sequential_readahead_chunks": 0,
                            "meta_ttl_s": 3600.0}


class HubReads:
    """The hub's reads of ``path`` (by chunk), in the order they reach its backend."""

    def __init__(self, open_object: Callable[[str], OpenObject], path: str) -> None:
        self._open = open_object
        self.path = path
        self.chunks: list[int] = []

    def open(self, path: str) -> OpenObject:
        return _Noted(self, path == self.path, self._open(path))


class _Noted:
    def __init__(self, reads: HubReads, noted: bool, inner: OpenObject) -> None:
        self._reads, self._noted, self._inner = reads, noted, inner
        self.info = inner.info

    def read(self, offset: int, length: int) -> bytes:
        if self._noted and length:
            self._reads.chunks.append(offset // CHUNK)
        return self._inner.read(offset, length)  # held at the gate when it is shut

    def close(self) -> None:
        self._inner.close()


def noted(gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]], path: str = PATH,
          chunks: int = len(PLAN)) -> tuple[HubReads, bytes]:
    """``path`` written, and the hub's reads of it noted as they come, before its gate."""
    data = write_dataset(str(dataset[0]), {path: chunks * CHUNK}, seed=5)[path]
    reads = HubReads(gated.open, path)
    gated.open = reads.open  # type: ignore[method-assign]
    return reads, data


async def post_plan(http: aiohttp.ClientSession, spoke: str, path: str = PATH,
                    plan: list[int] = PLAN) -> str:
    reads = [[path, chunk * CHUNK, SAMPLE] for chunk in plan]
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


def misses_at_least(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda doc: bool(doc["misses"] >= count)


async def test_loader_fetches_waiting_for_a_slot_go_in_plan_order(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    reads, data = noted(gated, dataset)
    # One fetch at a time: the hub's reads come one by one, in the order the spoke
    # hands out its one slot.
    spoke = await make_spoke(fetch_concurrency=1, **QUIET)
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
            await wait_for_stats(http, spoke.url, misses_at_least(k))
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


async def test_a_plans_prefetch_takes_every_idle_slot(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    reads, data = noted(gated, dataset)
    spoke = await make_spoke(fetch_concurrency=4, **QUIET)
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
    finally:
        gated.gate.set()
    # (A loader's fetch waiting meanwhile would go first: test_cold_slots. Which of two
    # fetches let go at once reaches the hub first is a race here.)
    hits = [await read_chunk(http, spoke.url, plan, chunk) for chunk in PLAN]
    assert hits == [data[c * CHUNK:c * CHUNK + SAMPLE] for c in PLAN]
    await wait_for_stats(http, spoke.url, lambda d: d["cached_chunks"] == len(PLAN))
    assert sorted(reads.chunks[:4]) == sorted(PLAN[:4])
    assert sorted(reads.chunks) == sorted(PLAN)


async def test_a_plan_prefetches_the_chunks_an_answer_has_not_asked_for_yet(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    path, chunks = "order/long.bin", 32
    plan_chunks = random.Random(3).sample(range(chunks), chunks)
    reads, data = noted(gated, dataset, path, chunks)
    # An answer reads its ranges' chunks one after the other (no read-ahead).
    spoke = await make_spoke(fetch_concurrency=2, **QUIET)
    async with http.head(f"{spoke.url}/objects/{path}") as resp:
        assert resp.status == 200
    reads.chunks.clear()
    gated.gate.clear()
    try:
        plan = await post_plan(http, spoke.url, path, plan_chunks)
        for _ in range(2):  # the plan's first two chunks, at the gate
            assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
        # One loader's request for the plan's first eight reads: they have all come
        # (the cursor is at the eighth) while the answer has asked for one chunk.
        wanted = plan_chunks[:8]
        ranges = ",".join(f"{c * CHUNK}-{c * CHUNK + SAMPLE - 1}" for c in wanted)
        loader = asyncio.create_task(http.get(
            f"{spoke.url}/objects/{path}",
            headers={"Range": f"bytes={ranges}", "X-Hubspoke-Plan": plan}))
        async with asyncio.timeout(WAIT_S):
            while True:
                async with http.get(f"{spoke.url}/plans/{plan}") as resp:
                    if (await resp.json())["cursor"] == 7:
                        break
                await asyncio.sleep(POLL_S)
    finally:
        gated.gate.set()
    async with await loader as resp:
        assert resp.status == 206
        body = await resp.read()
    for c in wanted:
        assert data[c * CHUNK:c * CHUNK + SAMPLE] in body
    await wait_for_stats(http, spoke.url, lambda d: d["cached_chunks"] == chunks)
    # The eight chunks first, whoever asked for them, but for one that may have raced
    # the next chunk's fetch to the hub in the other slot (the prefetch passing over
    # the reads that came fetched the next ones meanwhile); each fetched once.
    assert set(wanted) <= set(reads.chunks[:9]), (reads.chunks, plan_chunks)
    assert sorted(reads.chunks) == list(range(chunks))
