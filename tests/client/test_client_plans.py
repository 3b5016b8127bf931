"""The client's read plans, against a real spoke."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from spoke.client.clients import AsyncClient
from tests.conftest import CHUNK, SpokeFactory


async def test_a_plan_registered_by_the_client_makes_its_reads_hits(
    make_spoke: SpokeFactory, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    spoke = await make_spoke()
    reads = [("ds/big.bin", i * CHUNK + 100, 4096) for i in (7, 3, 30, 12)]
    async with AsyncClient(spoke.url) as client:
        plan = await client.create_plan(reads)
        client.use_plan(plan)
        for _ in range(200):
            async with http.get(f"{spoke.url}/stats") as resp:
                if (await resp.json())["prefetched_chunks"] == 4:
                    break
            await asyncio.sleep(0.02)
        for path, offset, length in reads:
            assert await client.read(path, offset, length) == files[path][offset:offset + length]
    async with http.get(f"{spoke.url}/stats") as resp:
        stats = await resp.json()
    assert (stats["hits"], stats["misses"], stats["prefetch_used"]) == (4, 0, 4)
    async with http.get(f"{spoke.url}/plans/{plan}") as resp:
        assert (await resp.json())["cursor"] == 3  # the reader's position, learnt from its reads
